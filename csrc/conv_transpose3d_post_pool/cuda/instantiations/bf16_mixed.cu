// The fused transposed-convolution kernels for bfloat16 operands, float32 accumulation, with a float32 multiplier and
// output (the mixed precision of torch.autocast, output.cuh).
#include "conv_transpose3d_post_pool/cuda/kernel.cuh"

namespace fused {
namespace conv_transpose3d_post_pool {
template void launch_form<Mode::kBF16, true>(const Params& p, int mt, bool train, cudaStream_t stream);
}  // namespace conv_transpose3d_post_pool
}  // namespace fused
