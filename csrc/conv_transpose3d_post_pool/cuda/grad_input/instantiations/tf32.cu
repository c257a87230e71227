// The input-gradient kernel of the fused convolution for TF32 tensor cores, double buffered (kernel_tf32.cuh); one
// file per precision so that the instantiations compile in parallel.
#include "conv_transpose3d_post_pool/cuda/grad_input/kernel_tf32.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {

size_t tf32_smem_bytes(int chunk_words) {
  return chunk_words == 16 ? double_buffered::smem_bytes<2>() : double_buffered::smem_bytes<1>();
}

// Chunks of 8 or 16 k-words.
void launch_tf32(const Params& p, int chunk_words, cudaStream_t stream) {
  TORCH_INTERNAL_ASSERT(chunk_words == 8 || chunk_words == 16, "chunk of ", chunk_words, " k-words");
  // The kernel decodes tile indices (below n_tiles plus one grid's width) in int.
  TORCH_CHECK(p.n_tiles < (int64_t(1) << 30),
              "conv_transpose3d_post_pool grad_input: too many tiles for one launch: ", p.n_tiles);
  if (chunk_words == 16) return double_buffered::launch_one<2>(p, stream);
  return double_buffered::launch_one<1>(p, stream);
}

}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
