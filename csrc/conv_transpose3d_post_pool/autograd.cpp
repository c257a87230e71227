// Autograd of fused::conv_transpose3d_post_pool and its training form _with_offsets, in C++ because it runs on
// every eager call (a Python Autograd kernel alone costs several microseconds of host time per call).
//
// A call that needs a gradient runs the training forward (_with_offsets), which saves per pooled output the
// convolution output it selected (bias included) and its window offset, plus the (small) input, weight and
// multiplier: no full-resolution tensor lives between forward and backward. Where the forward ran the fused CUDA
// kernel, backward stays at pooled resolution: fused::_conv_transpose3d_post_pool_grad_conv gives the convolution
// output's gradient at the selected taps (and the bias and multiplier gradients), _grad_weight and _grad_input
// the rest (csrc/conv_transpose3d_post_pool/backward.cpp). Elsewhere (CPU, float64, other geometries) it rebuilds
// the sparse gradient of the convolution output with fused::post_pool_backward, then calls aten's convolution
// backward for the inputs that need one. A call without gradients runs the inference op below autograd.
//
// Double backward is not supported: gradients computed with create_graph=True carry a node that raises when
// differentiated (as Python's once_differentiable does), instead of a silently wrong second derivative.
#include "common/autograd.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace fused {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef,
                              const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                              at::IntArrayRef, bool, std::optional<double>);
using TrainingSig = Outputs(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                            at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef, const at::Tensor&, double,
                            at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                            std::optional<double>);
using PoolBackwardSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double, std::optional<double>,
    c10::SymIntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool);
using GradConvSig = Outputs(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                            std::optional<double>);
using GradFromConvSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, at::IntArrayRef);

// The pooled-resolution backward ops. They are not differentiable: their Autograd kernels (registered below, from
// common/autograd.h) make their gradients raise when differentiated again.
constexpr char kFamily[] = "fused.conv_transpose3d_post_pool";
constexpr char kGradConv[] = "fused::_conv_transpose3d_post_pool_grad_conv";
constexpr char kGradWeight[] = "fused::_conv_transpose3d_post_pool_grad_weight";
constexpr char kGradInput[] = "fused::_conv_transpose3d_post_pool_grad_input";

const c10::TypedOperatorHandle<TrainingSig>& training_op() {
  static const auto h = op_handle<TrainingSig>("fused::conv_transpose3d_post_pool_with_offsets");
  return h;
}

// The schema's non-tensor arguments, as the dispatcher passed them (views valid for the call).
struct Args {
  at::IntArrayRef stride, padding, output_padding;
  int64_t groups;
  at::IntArrayRef dilation;
  double negative_slope;
  at::IntArrayRef kernel_size, pool_stride, pool_padding, pool_dilation;
  bool ceil_mode;
  std::optional<double> negative_slope2;
};

// int[3] arguments that the kernel has already validated: one value stands for all three dims; `dflt` for an
// empty list (the pool's stride).
std::vector<int64_t> as3(at::IntArrayRef v, at::IntArrayRef dflt = {}) {
  if (v.empty()) v = dflt;
  return v.size() == 1 ? std::vector<int64_t>{v[0], v[0], v[0]} : v.vec();
}

// Whether the training forward ran the fused CUDA kernel: fused_kernel_unsupported_reason (checks.h) == nullptr,
// restated on the arguments, for a call whose checks have passed, so that it needs no concrete input size (under
// tracing they may be symbolic). The pooled-size condition there holds for every valid size here except with
// ceil_mode and output_padding 0 (an odd convolution output). Only the weight's sizes are read (guarded when
// symbolic; parameters' sizes are static in compiled graphs).
bool ran_fused_kernel(const at::Tensor& input, const at::Tensor& weight, const Args& a) {
  const auto dtype = input.scalar_type();
  if (!input.is_cuda() || !(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) return false;
  if (a.groups != 1) return false;
  const auto s = as3(a.stride), p = as3(a.padding), o = as3(a.output_padding), d = as3(a.dilation);
  const auto k = as3(a.kernel_size), ps = as3(a.pool_stride, a.kernel_size), pp = as3(a.pool_padding),
             pd = as3(a.pool_dilation);
  for (int i = 0; i < 3; ++i) {
    if (s[i] != 2 || p[i] != 1 || d[i] != 1 || (o[i] != 0 && o[i] != 1)) return false;
    if (k[i] != 2 || ps[i] != 2 || pp[i] != 0 || pd[i] != 1) return false;
    if (a.ceil_mode && o[i] == 0) return false;
  }
  // C_in = 0 runs the composite (weight.size(0) is the input's channel count, checked).
  if (weight.sym_size(0) == 0) return false;
  return weight.sym_size(2) == 3 && weight.sym_size(3) == 3 && weight.sym_size(4) == 3;
}

// The autograd graph node. Works on symbolic sizes too (AOTAutograd traces it with fake tensors): nothing here
// reads a concrete size; shapes are recomputed in backward from the saved input and weight. Its one output is
// `out`: selected and offsets, which are not differentiable, leave forward through `outputs` instead of being
// marked non-differentiable, because compiled autograd rejects C++ nodes that used mark_non_differentiable.
struct ConvPostPoolFunction : public torch::autograd::Function<ConvPostPoolFunction> {
  // Backward reads only its saved tensors and saved_data and calls ops that have fake impls, so compiled
  // autograd may trace it into its graph.
  static constexpr bool is_traceable = true;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, const at::Tensor& multiplier, const Args& a,
                               Outputs* outputs) {
    {
      // The kernel below runs every check before anything is saved.
      const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
      *outputs = training_op().call(input, weight, bias, a.stride, a.padding, a.output_padding, a.groups, a.dilation,
                                    multiplier, a.negative_slope, a.kernel_size, a.pool_stride, a.pool_padding,
                                    a.pool_dilation, a.ceil_mode, a.negative_slope2);
    }
    const auto& [out, selected, offsets] = *outputs;
    ctx->save_for_backward({input, weight, multiplier, selected, offsets});
    const bool has_bias = bias.has_value() && bias->defined();
    auto& d = ctx->saved_data;
    d["has_bias"] = has_bias;
    d["stride"] = as3(a.stride);
    d["padding"] = as3(a.padding);
    d["output_padding"] = as3(a.output_padding);
    d["dilation"] = as3(a.dilation);
    d["groups"] = a.groups;
    d["kernel_size"] = as3(a.kernel_size);
    d["pool_stride"] = as3(a.pool_stride, a.kernel_size);
    d["pool_padding"] = as3(a.pool_padding);
    d["pool_dilation"] = as3(a.pool_dilation);
    d["slope"] = a.negative_slope;
    d["slope2"] = a.negative_slope2.has_value() ? c10::IValue(*a.negative_slope2) : c10::IValue();
    // The outputs are contiguous or channels_last_3d (the convolution's layout); the convolution output's
    // gradient takes the same one.
    d["channels_last"] = !out.is_contiguous();
    d["fused"] = ran_fused_kernel(input, weight, a);
    return {out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &weight = saved[1], &multiplier = saved[2], &selected = saved[3],
                     &offsets = saved[4];
    auto& d = ctx->saved_data;
    const bool has_bias = d["has_bias"].toBool();
    // Edges are the tensor inputs that were defined: input, weight, [bias], multiplier.
    const bool need_input = ctx->needs_input_grad(0);
    const bool need_weight = ctx->needs_input_grad(1);
    const bool need_bias = has_bias && ctx->needs_input_grad(2);
    const bool need_multiplier = ctx->needs_input_grad(has_bias ? 3 : 2);
    // One entry per forward argument: input, weight, bias, multiplier, Args, outputs.
    variable_list result(6);
    const at::Tensor& grad_out = grads[0];
    if (!grad_out.defined()) return result;

    const auto stride = d["stride"].toIntVector(), padding = d["padding"].toIntVector(),
               output_padding = d["output_padding"].toIntVector(), dilation = d["dilation"].toIntVector();
    const int64_t groups = d["groups"].toInt();
    // The convolution output's size, as the forward's checks computed it (symbolic under tracing).
    std::vector<c10::SymInt> conv_size = {input.sym_size(0), weight.sym_size(1) * groups};
    for (int i = 0; i < 3; ++i) {
      conv_size.push_back((input.sym_size(2 + i) - 1) * stride[i] - 2 * padding[i] +
                          (weight.sym_size(2 + i) - 1) * dilation[i] + output_padding[i] + 1);
    }
    const std::optional<double> slope2 =
        d["slope2"].isNone() ? std::nullopt : std::optional<double>(d["slope2"].toDouble());
    const auto create_graph = at::GradMode::is_enabled();
    if (d["fused"].toBool()) {
      pooled_backward(input, weight, multiplier, selected, offsets, grad_out, d["slope"].toDouble(), slope2,
                      output_padding, need_input, need_weight, need_bias, need_multiplier, result);
      if (create_graph) mark_once_differentiable(result, grad_out, input, weight, multiplier);
      return result;
    }
    {
      const at::NoGradGuard no_grad;
      static const auto pool_backward = op_handle<PoolBackwardSig>("fused::post_pool_backward");
      auto [grad_y, grad_multiplier] = pool_backward.call(
          grad_out, selected, offsets, multiplier, d["slope"].toDouble(), slope2, conv_size,
          d["kernel_size"].toIntVector(), d["pool_stride"].toIntVector(), d["pool_padding"].toIntVector(),
          d["pool_dilation"].toIntVector(), d["channels_last"].toBool());
      if (need_multiplier) result[3] = grad_multiplier;
      if (need_input || need_weight || need_bias) {
        const std::vector<c10::SymInt> bias_sizes = {conv_size[1]};
        auto [gi, gw, gb] = at::convolution_backward_symint(
            grad_y, input, weight, has_bias ? at::OptionalSymIntArrayRef(bias_sizes) : std::nullopt,
            c10::fromIntArrayRefSlow(stride), c10::fromIntArrayRefSlow(padding), c10::fromIntArrayRefSlow(dilation),
            /*transposed=*/true, c10::fromIntArrayRefSlow(output_padding), c10::SymInt(groups),
            {need_input, need_weight, need_bias});
        if (need_input) result[0] = gi;
        if (need_weight) result[1] = gw;
        if (need_bias) result[2] = gb;
      }
    }
    if (create_graph) mark_once_differentiable(result, grad_out, input, weight, multiplier);
    return result;
  }

  // The fused kernel's backward at pooled resolution: grad_conv (with the bias and multiplier gradients) at the
  // selected taps, then the weight's and the input's gradients from it, each only if needed. The ops run below
  // autograd: their results never require grad (mark_once_differentiable handles create_graph), so their
  // autograd kernels would only cost host time.
  static void pooled_backward(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& multiplier,
                              const at::Tensor& selected, const at::Tensor& offsets, const at::Tensor& grad_out,
                              double slope, std::optional<double> slope2, at::IntArrayRef output_padding,
                              bool need_input, bool need_weight, bool need_bias, bool need_multiplier,
                              variable_list& result) {
    static const auto grad_conv_op = op_handle<GradConvSig>(kGradConv);
    static const auto grad_weight_op = op_handle<GradFromConvSig>(kGradWeight);
    static const auto grad_input_op = op_handle<GradFromConvSig>(kGradInput);
    const at::NoGradGuard no_grad;
    const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
    auto [grad_conv, grad_bias, grad_multiplier] =
        grad_conv_op.call(grad_out, selected, offsets, multiplier, slope, slope2);
    if (need_multiplier) result[3] = grad_multiplier;
    if (need_bias) result[2] = grad_bias;
    if (need_weight) result[1] = grad_weight_op.call(grad_conv, offsets, input, output_padding);
    if (need_input) result[0] = grad_input_op.call(grad_conv, offsets, weight, output_padding);
  }

  // Gradients that will not differentiate again (raise_on_double_backward): they depend on grad_out, input,
  // weight and multiplier.
  static void mark_once_differentiable(variable_list& result, const at::Tensor& grad_out, const at::Tensor& input,
                                       const at::Tensor& weight, const at::Tensor& multiplier) {
    raise_on_double_backward(
        "fused::conv_transpose3d_post_pool: double backward is not supported (its gradients were computed with "
        "create_graph=True and are being differentiated again)",
        {grad_out, input, weight, multiplier}, result);
  }
};

Outputs conv_transpose3d_post_pool_with_offsets_autograd(const at::Tensor& input, const at::Tensor& weight,
                                                         const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                                         at::IntArrayRef padding, at::IntArrayRef output_padding,
                                                         int64_t groups, at::IntArrayRef dilation,
                                                         const at::Tensor& multiplier, double negative_slope,
                                                         at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                                                         at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation,
                                                         bool ceil_mode, std::optional<double> negative_slope2) {
  if (needs_grad({&input, &weight, bias.has_value() ? &*bias : nullptr, &multiplier})) {
    const Args a{stride,       padding,     output_padding, groups,        dilation,  negative_slope,
                 kernel_size,  pool_stride, pool_padding,   pool_dilation, ceil_mode, negative_slope2};
    Outputs outputs;
    auto out = ConvPostPoolFunction::apply(input, weight, bias, multiplier, a, &outputs);
    return {out[0], std::get<1>(outputs), std::get<2>(outputs)};
  }
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  return training_op().call(input, weight, bias, stride, padding, output_padding, groups, dilation, multiplier,
                            negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                            negative_slope2);
}

// A call that needs a gradient goes through the training form's autograd above (so compiled training graphs
// show _with_offsets); otherwise a fresh call below autograd.
at::Tensor conv_transpose3d_post_pool_autograd(const at::Tensor& input, const at::Tensor& weight,
                                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                                   at::IntArrayRef dilation, const at::Tensor& multiplier, double negative_slope,
                                   at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                                   at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode,
                                   std::optional<double> negative_slope2) {
  if (needs_grad({&input, &weight, bias.has_value() ? &*bias : nullptr, &multiplier})) {
    return std::get<0>(training_op().call(input, weight, bias, stride, padding, output_padding, groups, dilation,
                                          multiplier, negative_slope, kernel_size, pool_stride, pool_padding,
                                          pool_dilation, ceil_mode, negative_slope2));
  }
  static const auto inference = op_handle<ForwardSig>("fused::conv_transpose3d_post_pool");
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  return inference.call(input, weight, bias, stride, padding, output_padding, groups, dilation, multiplier,
                        negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                        negative_slope2);
}

// _conv_transpose3d_post_pool_cast: a call that needs a gradient casts (differentiable casts, which give the float32
// operands their gradients as eager autocast's do) and goes through the op's autograd above; otherwise a fresh call
// below autograd, where the kernel may round the operands itself.
at::Tensor conv_transpose3d_post_pool_cast_autograd(const at::Tensor& input, const at::Tensor& weight,
                                                    const std::optional<at::Tensor>& bias, at::ScalarType dtype,
                                                    at::IntArrayRef stride, at::IntArrayRef padding,
                                                    at::IntArrayRef output_padding, int64_t groups,
                                                    at::IntArrayRef dilation, const at::Tensor& multiplier,
                                                    double negative_slope, at::IntArrayRef kernel_size,
                                                    at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                                                    at::IntArrayRef pool_dilation, bool ceil_mode,
                                                    std::optional<double> negative_slope2) {
  if (needs_grad({&input, &weight, bias.has_value() ? &*bias : nullptr, &multiplier})) {
    std::optional<at::Tensor> b;
    if (bias.has_value() && bias->defined()) b = bias->to(dtype);
    return conv_transpose3d_post_pool_autograd(input.to(dtype), weight.to(dtype), b, stride, padding, output_padding,
                                               groups, dilation, multiplier, negative_slope, kernel_size, pool_stride,
                                               pool_padding, pool_dilation, ceil_mode, negative_slope2);
  }
  using CastSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::ScalarType,
                             at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef,
                             const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                             at::IntArrayRef, bool, std::optional<double>);
  static const auto cast_op = op_handle<CastSig>("fused::_conv_transpose3d_post_pool_cast");
  const c10::impl::ExcludeDispatchKeyGuard below(c10::autograd_dispatch_keyset);
  return cast_op.call(input, weight, bias, dtype, stride, padding, output_padding, groups, dilation, multiplier,
                      negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                      negative_slope2);
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, Autograd, m) {
  m.impl("conv_transpose3d_post_pool", &fused::conv_transpose3d_post_pool_autograd);
  m.impl("_conv_transpose3d_post_pool_cast", &fused::conv_transpose3d_post_pool_cast_autograd);
  m.impl("conv_transpose3d_post_pool_with_offsets", &fused::conv_transpose3d_post_pool_with_offsets_autograd);
  m.impl("_conv_transpose3d_post_pool_grad_conv",
         &fused::NotDifferentiable<fused::kGradConv, fused::kFamily, fused::GradConvSig>::call);
  m.impl("_conv_transpose3d_post_pool_grad_weight",
         &fused::NotDifferentiable<fused::kGradWeight, fused::kFamily, fused::GradFromConvSig>::call);
  m.impl("_conv_transpose3d_post_pool_grad_input",
         &fused::NotDifferentiable<fused::kGradInput, fused::kFamily, fused::GradFromConvSig>::call);
}
