// The CUDA backward's 2x2x2 fast path (backward_tiled.cu), tried first by launch_backward_cuda.
#pragma once

#include "post_pool/launchers.h"

#include <cuda_runtime.h>

#include <optional>

namespace fused {
namespace post_pool {

// Writes grad_input and returns the parameter gradients when the geometry (2x2x2 windows tiling the whole input),
// dtype (not float64), offsets (uint8) and alignment allow the fast kernels; nothing, and no work, otherwise.
std::optional<ParamGrads> launch_backward_tiled2_cuda(const BackwardInputs& b, const at::Tensor& grad_input,
                                                      const BackwardTuning& tuning, cudaStream_t stream);

}  // namespace post_pool
}  // namespace fused
