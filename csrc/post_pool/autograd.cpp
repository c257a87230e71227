// The Autograd kernels of fused::post_pool and fused::post_pool_bias: when a gradient is needed, run the training
// forward (post_pool_with_offsets / post_pool_bias_with_offsets, whose autograd formula is registered from Python
// and saves pooled-size tensors only) and return its output; otherwise call the inference op below autograd.
//
// Why C++: this step ran on every call, and as a Python kernel it cost about 7 us of host time per call on our CPU
// machine (more on the GPU machine's host), which made back-to-back 16-bit calls at the default size host-bound.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fused {
namespace {

using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                              at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using TrainingSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, double,
                                                                   at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                                   at::IntArrayRef, bool, std::optional<double>);
using BiasForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::IntArrayRef,
                                  at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using BiasTrainingSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
    at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);

template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

bool needs_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts) {
    if (t->defined() && t->requires_grad()) return true;
  }
  return false;
}

// A fresh call below autograd (the same as torch._C._AutoDispatchBelowAutograd in Python), not a redispatch.
at::Tensor post_pool_autograd(const at::Tensor& input, const at::Tensor& multiplier, double negative_slope,
                              at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef dilation, bool ceil_mode, std::optional<double> negative_slope2) {
  if (needs_grad({&input, &multiplier})) {
    static const auto training = op_handle<TrainingSig>("fused::post_pool_with_offsets");
    return std::get<0>(training.call(input, multiplier, negative_slope, kernel_size, stride, padding, dilation,
                                     ceil_mode, negative_slope2));
  }
  static const auto inference = op_handle<ForwardSig>("fused::post_pool");
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  return inference.call(input, multiplier, negative_slope, kernel_size, stride, padding, dilation, ceil_mode,
                        negative_slope2);
}

at::Tensor post_pool_bias_autograd(const at::Tensor& input, const at::Tensor& bias, const at::Tensor& multiplier,
                                   double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                   std::optional<double> negative_slope2) {
  if (needs_grad({&input, &bias, &multiplier})) {
    static const auto training = op_handle<BiasTrainingSig>("fused::post_pool_bias_with_offsets");
    return std::get<0>(training.call(input, bias, multiplier, negative_slope, kernel_size, stride, padding,
                                     dilation, ceil_mode, negative_slope2));
  }
  static const auto inference = op_handle<BiasForwardSig>("fused::post_pool_bias");
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  return inference.call(input, bias, multiplier, negative_slope, kernel_size, stride, padding, dilation, ceil_mode,
                        negative_slope2);
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("post_pool", &fused::post_pool_autograd);
  m.impl("post_pool_bias", &fused::post_pool_bias_autograd);
}
