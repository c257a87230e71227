// The per-channel sum of the CUDA fast backward's partials (channel_sum.cu), used by
// backward_tiled.cu: planned before the main kernel launches, run after it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <utility>

namespace fused {
namespace post_pool {

struct ChannelSumShape {
  int TC, J;                      // channels per block, row lanes per channel (a power of two)
  int64_t tiles, splits, chunk;   // channel tiles, ranges of K, and K per range
};

// How the per-channel sum of a backward's partials (float, viewed [K / R, C, R]) runs: the shape of its first
// pass, which is all when one range per channel suffices (block partials at the default size, both layouts), and,
// where it would take two passes, the single-launch form's shape and scratch ([operands, splits, C] double sums,
// then the block counter). Made before the main kernel launches, because that kernel zeroes the counter.
struct ChannelSumPlan {
  int64_t C = 0, R = 0, K = 0;
  ChannelSumShape first{};
  std::optional<ChannelSumShape> fold;
  at::Tensor scratch;
  double* mid = nullptr;
  unsigned int* counter = nullptr;
  bool dependent_launches = true;  // BackwardTuning::dependent_launches
};

// The plan for summing `parts` float partials viewed [K / R, C, R] over `operands` (1: multiplier, 2: and bias);
// `opts` places its scratch. `single_launch_sum` and `dependent_launches`: BackwardTuning's.
ChannelSumPlan plan_channel_sum(int64_t C, int64_t R, int64_t parts, int operands, const at::TensorOptions& opts,
                                bool single_launch_sum, bool dependent_launches);

// Per-channel sums of the partials `part` (and `part_bias` when defined), as planned, in the type `out`: float, or
// the 16-bit dtype of the gradient they become, so that no cast kernel follows. The results take the shapes `sizes`
// and `sizes_bias` (C elements each: the parameter's own shape, so that no reshape follows on the host).
std::pair<at::Tensor, at::Tensor> sum_channel_partials(const ChannelSumPlan& plan, const at::Tensor& part,
                                                       const at::Tensor& part_bias, at::ScalarType out,
                                                       at::IntArrayRef sizes, at::IntArrayRef sizes_bias,
                                                       cudaStream_t stream);

}  // namespace post_pool
}  // namespace fused
