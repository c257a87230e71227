// The fused transposed-convolution kernels for TF32 tensor cores (float32 operands rounded to nearest); one file per
// precision so that the instantiations compile in parallel.
#include "conv_transpose3d_post_pool/cuda/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
template void launch_mode<Mode::kTF32>(const Params& p, int mt, bool train, cudaStream_t stream);
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
