// Autograd of the post_pool ops, in C++ because it runs on every eager training call: a Python autograd formula
// costs tens of microseconds of host time per forward and backward, more than the CPU kernels at small sizes.
//
// post_pool and post_pool_bias: a call that needs a gradient runs the training forward (post_pool_with_offsets /
// post_pool_bias_with_offsets) through the dispatcher, so that compiled training graphs show it; otherwise the
// inference op runs below autograd.
//
// The training forwards' node saves only pooled-size tensors (the selected input values, their window offsets)
// besides the multiplier and bias, never the full-resolution input; backward is post_pool_backward /
// post_pool_bias_backward on them. The backward ops' own results raise when differentiated again.
#include "common/autograd.h"
#include "post_pool/post_pool.h"

#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fused {
namespace post_pool {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                              at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using TrainingSig = Outputs(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                            at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using BiasForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::IntArrayRef,
                                  at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using BiasTrainingSig = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, double, at::IntArrayRef,
                                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using BackwardSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, std::optional<double>,
    c10::SymIntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool);
using BiasBackwardSig = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                const at::Tensor&, double, std::optional<double>, c10::SymIntArrayRef,
                                at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool);

// The backward ops. They are not differentiable: their Autograd kernels (registered below, from common/autograd.h)
// make their gradients raise when differentiated again.
constexpr char kFamily[] = "fused.post_pool";
constexpr char kBackward[] = "fused::post_pool_backward";
constexpr char kBiasBackward[] = "fused::post_pool_bias_backward";

// The training forwards' non-tensor arguments, as the dispatcher passed them (views valid for the call).
struct Args {
  double negative_slope;
  at::IntArrayRef kernel_size, stride, padding, dilation;
  bool ceil_mode;
  std::optional<double> negative_slope2;
};

// post_pool_bias_with_offsets with a bias, else post_pool_with_offsets; below autograd.
Outputs training_forward(const at::Tensor& input, const std::optional<at::Tensor>& bias,
                         const at::Tensor& multiplier, const Args& a) {
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  if (bias.has_value()) {
    static const auto op = op_handle<BiasTrainingSig>("fused::post_pool_bias_with_offsets");
    return op.call(input, *bias, multiplier, a.negative_slope, a.kernel_size, a.stride, a.padding, a.dilation,
                   a.ceil_mode, a.negative_slope2);
  }
  static const auto op = op_handle<TrainingSig>("fused::post_pool_with_offsets");
  return op.call(input, multiplier, a.negative_slope, a.kernel_size, a.stride, a.padding, a.dilation, a.ceil_mode,
                 a.negative_slope2);
}

// What backward reads from saved_data: the backward ops' arguments after the tensors, in their order.
struct BackwardArgs {
  double slope;
  std::optional<double> slope2;
  std::vector<c10::SymInt> input_size;
  std::vector<int64_t> kernel_size, stride, padding, dilation;
  bool channels_last;
};

BackwardArgs backward_args(AutogradContext* ctx) {
  auto& d = ctx->saved_data;
  return {d["slope"].toDouble(),
          d["slope2"].isNone() ? std::nullopt : std::optional<double>(d["slope2"].toDouble()),
          d["input_size"].toSymIntVector(),
          d["kernel_size"].toIntVector(),
          d["stride"].toIntVector(),
          d["padding"].toIntVector(),
          d["dilation"].toIntVector(),
          d["channels_last"].toBool()};
}

// The graph node of both training forwards. Its one output is `out`: selected and offsets, which are not
// differentiable, leave forward through `outputs` instead of being marked non-differentiable, because compiled
// autograd rejects C++ nodes that used mark_non_differentiable. Nothing here reads a concrete size: under
// AOTAutograd the input's sizes are symbolic and reach the backward op as SymInts.
struct PostPoolFunction : public torch::autograd::Function<PostPoolFunction> {
  // Backward reads only its saved tensors and saved_data and calls ops that have fake impls, so compiled
  // autograd may trace it into its graph.
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const std::optional<at::Tensor>& bias,
                               const at::Tensor& multiplier, const Args& a, Outputs* outputs) {
    // The kernel runs every check before anything is saved.
    *outputs = training_forward(input, bias, multiplier, a);
    const auto& [out, selected, offsets] = *outputs;
    variable_list saved = {selected, offsets, multiplier};
    if (bias.has_value()) saved.push_back(*bias);
    ctx->save_for_backward(std::move(saved));
    auto& d = ctx->saved_data;
    d["input_size"] = input.sym_sizes();
    d["kernel_size"] = a.kernel_size.vec();
    d["stride"] = a.stride.vec();
    d["padding"] = a.padding.vec();
    d["dilation"] = a.dilation.vec();
    d["slope"] = a.negative_slope;
    d["slope2"] = a.negative_slope2.has_value() ? c10::IValue(*a.negative_slope2) : c10::IValue();
    // grad_input takes the layout the forward read the input in.
    d["channels_last"] = output_memory_format(input) == at::MemoryFormat::ChannelsLast3d;
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const bool has_bias = saved.size() == 4;
    auto [grad_input, grad_bias, grad_multiplier] = has_bias ? bias_backward(ctx, grads[0], saved)
                                                             : plain_backward(ctx, grads[0], saved);
    // One entry per forward argument: input, bias, multiplier, Args, outputs. The edges are the tensors among
    // them that were given: input, [bias], multiplier.
    variable_list result(5);
    if (ctx->needs_input_grad(0)) result[0] = grad_input;
    if (has_bias && ctx->needs_input_grad(1)) result[1] = grad_bias;
    if (ctx->needs_input_grad(has_bias ? 2 : 1)) result[2] = grad_multiplier;
    return result;
  }

  // Called through the dispatcher with autograd: under create_graph=True the backward op's own Autograd kernel
  // makes its gradients raise when differentiated again.
  static Outputs plain_backward(AutogradContext* ctx, const at::Tensor& grad_out, const variable_list& saved) {
    static const auto op = op_handle<BackwardSig>(kBackward);
    const BackwardArgs s = backward_args(ctx);
    auto [grad_input, grad_multiplier] =
        op.call(grad_out, saved[0], saved[1], saved[2], s.slope, s.slope2, s.input_size, s.kernel_size, s.stride,
                s.padding, s.dilation, s.channels_last);
    return {grad_input, at::Tensor(), grad_multiplier};
  }

  static Outputs bias_backward(AutogradContext* ctx, const at::Tensor& grad_out, const variable_list& saved) {
    static const auto op = op_handle<BiasBackwardSig>(kBiasBackward);
    const BackwardArgs s = backward_args(ctx);
    return op.call(grad_out, saved[0], saved[1], saved[3], saved[2], s.slope, s.slope2, s.input_size, s.kernel_size,
                   s.stride, s.padding, s.dilation, s.channels_last);
  }
};

Outputs training_autograd(const at::Tensor& input, const std::optional<at::Tensor>& bias,
                          const at::Tensor& multiplier, const Args& a) {
  if (!needs_grad({&input, bias.has_value() ? &*bias : nullptr, &multiplier})) {
    return training_forward(input, bias, multiplier, a);
  }
  Outputs outputs;
  auto out = PostPoolFunction::apply(input, bias, multiplier, a, &outputs);
  return {out[0], std::get<1>(outputs), std::get<2>(outputs)};
}

Outputs post_pool_with_offsets_autograd(const at::Tensor& input, const at::Tensor& multiplier,
                                        double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                        at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                        std::optional<double> negative_slope2) {
  return training_autograd(input, std::nullopt, multiplier,
                           {negative_slope, kernel_size, stride, padding, dilation, ceil_mode, negative_slope2});
}

Outputs post_pool_bias_with_offsets_autograd(const at::Tensor& input, const at::Tensor& bias,
                                             const at::Tensor& multiplier, double negative_slope,
                                             at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                             at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                             std::optional<double> negative_slope2) {
  return training_autograd(input, bias, multiplier,
                           {negative_slope, kernel_size, stride, padding, dilation, ceil_mode, negative_slope2});
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
}  // namespace post_pool
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  namespace pp = fused::post_pool;
  m.impl("post_pool", &pp::post_pool_autograd);
  m.impl("post_pool_with_offsets", &pp::post_pool_with_offsets_autograd);
  m.impl("post_pool_backward", &fused::NotDifferentiable<pp::kBackward, pp::kFamily, pp::BackwardSig>::call);
  m.impl("post_pool_bias", &pp::post_pool_bias_autograd);
  m.impl("post_pool_bias_with_offsets", &pp::post_pool_bias_with_offsets_autograd);
  m.impl("post_pool_bias_backward",
         &fused::NotDifferentiable<pp::kBiasBackward, pp::kFamily, pp::BiasBackwardSig>::call);
}
