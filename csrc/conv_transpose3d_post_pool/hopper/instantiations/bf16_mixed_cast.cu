// The sm_90a fused transposed-convolution kernel, Mode::kBF16, MIXED = true, CAST = true: float32 operands rounded
// to the 16-bit dtype as they load (hopper/kernel.cuh, cuda/source.cuh).
#include "conv_transpose3d_post_pool/hopper/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {
template void launch_hopper_form<Mode::kBF16, true, true>(const Params& p, bool train, cudaStream_t stream);
}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
