// The contract between the op entry points (op.cpp: checks, allocation, device guard, empty early
// return) and the per-device launchers (cpu/kernels.cpp, cuda/forward.cu, cuda/backward.cu),
// which only run kernels on what the entry points hand them.
#pragma once

#include "post_pool/post_pool.h"

#include <ATen/core/Tensor.h>

namespace fused {
namespace post_pool {

// What a forward launcher writes: out always; selected and offsets (training forward) when defined. All in the
// input's layout (ForwardInputs::format), allocated by the entry point, never empty.
struct ForwardOutputs {
  at::Tensor out, selected, offsets;
  bool save() const { return selected.defined(); }
};

// What a backward launcher reads: the checked geometry, grad_output / selected / offsets in the layout of
// grad_input, the flattened multiplier (and bias), the slopes, and the parameters as the op received them (their
// gradients take those shapes and dtypes).
struct BackwardInputs {
  PoolGeometry g;
  at::MemoryFormat format;
  at::Tensor grad_output, selected, offsets;
  at::Tensor multiplier_flat, bias_flat;  // bias_flat undefined without a bias
  at::Tensor multiplier, bias;
  double s1, s2;
};

// The parameter gradients a backward launcher returns, in the parameters' shapes and dtypes (bias: undefined
// without one).
struct ParamGrads {
  at::Tensor bias, multiplier;
};

// Launch choices of the CUDA backward. The defaults are the measured ones (benchmarks/post_pool/backward_sweep.py on
// the H200, docs/performance.md), and are what every public op uses; the private op
// fused::_post_pool_backward_tuned takes others, for the sweep and for the tests that compare the forms.
struct BackwardTuning {
  // Packs per thread of the channels_last 2x2x2 kernel (1, 2, 4 or 8); 0: by dtype, the sweep's fastest: 8 for
  // float32, 2 for 16-bit types.
  int cl_items = 0;
  // Programmatic dependent launches between the backward's kernels (Hopper and later; plain elsewhere and inside
  // CUDA-graph captures). Changes no result.
  bool dependent_launches = true;
  // The single-launch form of the per-channel sum where it would otherwise take two passes (faster there in the
  // sweep). It adds in another order, so the parameter gradients may differ in their last bits from the two-pass
  // form; each is deterministic.
  bool single_launch_sum = true;
};

// The general (not 2x2x2-tiled) backward's per-output contributions to the parameter gradients, full pooled size
// in the op-math dtype, and their reduction. Shared by both devices' general paths.
struct GradPartials {
  at::Tensor multiplier, bias;  // bias undefined without one
};
GradPartials alloc_grad_partials(const BackwardInputs& b);
ParamGrads reduce_grad_partials(const GradPartials& p, const BackwardInputs& b);

void launch_forward_cpu(const ForwardInputs& f, const ForwardOutputs& o);
ParamGrads launch_backward_cpu(const BackwardInputs& b, const at::Tensor& grad_input);
#ifdef WITH_CUDA
void launch_forward_cuda(const ForwardInputs& f, const ForwardOutputs& o);
ParamGrads launch_backward_cuda(const BackwardInputs& b, const at::Tensor& grad_input, const BackwardTuning& tuning);
#endif

}  // namespace post_pool
}  // namespace fused
