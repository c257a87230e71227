// The sm_90a fused transposed-convolution kernel, Mode::kStrict (strict float32, inference form; hopper/kernel.cuh).
#include "conv_transpose3d_post_pool/hopper/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
namespace hopper {
template void launch_hopper_form<Mode::kStrict, false>(const Params& p, bool train, cudaStream_t stream);
}  // namespace hopper
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
