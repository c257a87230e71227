// The input-gradient kernels of the fused convolution for bfloat16; one file per precision so that the
// instantiations compile in parallel.
#include "conv_transpose3d_post_pool/cuda/grad_input/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {
template void launch_mode<Mode::kBF16>(const Params& p, int chunk_words, cudaStream_t stream);
}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
