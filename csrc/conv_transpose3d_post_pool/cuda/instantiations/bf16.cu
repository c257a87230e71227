// The fused transposed-convolution kernels for bfloat16 operands, output in the operands' dtype. One file per precision
// and output form, so that the instantiations compile in parallel.
#include "conv_transpose3d_post_pool/cuda/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
template void launch_form<Mode::kBF16, false>(const Params& p, int mt, bool train, cudaStream_t stream);
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
