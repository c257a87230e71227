// The input-gradient kernels of the fused convolution for strict float32 (three TF32 products); one file per precision
// so that the instantiations compile in parallel.
#include "conv_transpose3d_post_pool/cuda/grad_input/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace grad_input {
template void launch_mode<Mode::kStrict>(const Params& p, int chunk_words, cudaStream_t stream);
}  // namespace grad_input
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
