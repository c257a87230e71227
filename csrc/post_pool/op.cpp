// The CPU and CUDA kernels of the six post_pool ops (post_pool, post_pool_with_offsets, post_pool_backward and
// their post_pool_bias variants): one entry point per op for both devices, in ATen's order - argument checks,
// device guard, output allocation, empty early return - then the device's launcher (launchers.h), which
// takes the stream and dispatches on dtype.
#include "common/cpu_huge_pages.h"
#include "post_pool/launchers.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fused {
namespace post_pool {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const char* op, bool save, const at::Tensor& input,
                                                       const at::Tensor& multiplier, double negative_slope,
                                                       at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                                       at::IntArrayRef padding, at::IntArrayRef dilation,
                                                       bool ceil_mode, std::optional<double> negative_slope2,
                                                       const std::optional<at::Tensor>& bias = std::nullopt) {
  const ForwardInputs f = prepare_forward(op, input, multiplier, kernel_size, stride, padding, dilation, ceil_mode,
                                          negative_slope, negative_slope2, bias);
  const PoolGeometry& g = f.g;
  const c10::OptionalDeviceGuard guard(input.device());
  ForwardOutputs o;
  o.out = at::empty({g.N, g.C, g.OD, g.OH, g.OW},
                    input.options()
                        .dtype(output_dtype(input.scalar_type(), multiplier.scalar_type()))
                        .memory_format(f.format));
  advise_huge_pages(o.out);
  if (save) {
    o.selected = at::empty_like(o.out, o.out.options().dtype(input.scalar_type()));
    o.offsets = at::empty_like(o.out, o.out.options().dtype(g.offset_dtype()));
    advise_huge_pages(o.selected);
    advise_huge_pages(o.offsets);
  }
  if (!g.empty()) {
#ifdef WITH_CUDA
    if (input.is_cuda()) {
      launch_forward_cuda(f, o);
    } else
#endif
    {
      launch_forward_cpu(f, o);
    }
  }
  return {o.out, o.selected, o.offsets};
}

// Shared by post_pool_backward, post_pool_bias_backward and the private tuned form; grad_bias is undefined
// without a bias.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
    const char* op, const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const std::optional<at::Tensor>& bias, const at::Tensor& multiplier, double negative_slope,
    std::optional<double> negative_slope2, at::IntArrayRef input_size, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool channels_last,
    const BackwardTuning& tuning = BackwardTuning()) {
  BackwardInputs b;
  b.g = check_post_pool_backward_args(grad_output, selected, offsets, multiplier, input_size, kernel_size, stride,
                                      padding, dilation, channels_last);
  // grad_input and a bias take the input's dtype, saved as selected's (grad_output's may be the promoted one).
  if (bias.has_value()) check_bias(op, *bias, b.g.C, selected.scalar_type(), grad_output.device());
  check_slopes(op, selected.scalar_type(), negative_slope, negative_slope2);
  const c10::OptionalDeviceGuard guard(grad_output.device());
  b.format = channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  at::Tensor grad_input = at::empty(input_size, selected.options().memory_format(b.format));
  advise_huge_pages(grad_input);
  b.multiplier = multiplier;
  if (bias.has_value()) b.bias = *bias;
  if (b.g.empty()) {
    const at::Tensor grad_bias = bias.has_value() ? at::zeros(bias->sizes(), bias->options()) : at::Tensor();
    return {grad_input, grad_bias, at::zeros(multiplier.sizes(), multiplier.options())};
  }
  b.grad_output = grad_output.contiguous(b.format);
  b.selected = selected.contiguous(b.format);
  b.offsets = offsets.contiguous(b.format);
  b.multiplier_flat = flat_multiplier(multiplier);
  if (bias.has_value()) b.bias_flat = bias->contiguous();
  b.s1 = negative_slope;
  b.s2 = negative_slope2.value_or(negative_slope);
  ParamGrads p;
#ifdef WITH_CUDA
  if (grad_output.is_cuda()) {
    p = launch_backward_cuda(b, grad_input, tuning);
  } else
#endif
  {
    p = launch_backward_cpu(b, grad_input);
  }
  return {grad_input, p.bias, p.multiplier};
}

at::Tensor post_pool(const at::Tensor& input, const at::Tensor& multiplier, double negative_slope,
                     at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                     at::IntArrayRef dilation, bool ceil_mode, std::optional<double> negative_slope2) {
  return std::get<0>(forward("fused::post_pool", false, input, multiplier, negative_slope, kernel_size, stride,
                             padding, dilation, ceil_mode, negative_slope2));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_with_offsets(
    const at::Tensor& input, const at::Tensor& multiplier, double negative_slope, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
    std::optional<double> negative_slope2) {
  return forward("fused::post_pool_with_offsets", true, input, multiplier, negative_slope, kernel_size, stride,
                 padding, dilation, ceil_mode, negative_slope2);
}

at::Tensor post_pool_bias(const at::Tensor& input, const at::Tensor& bias, const at::Tensor& multiplier,
                          double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                          at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                          std::optional<double> negative_slope2) {
  return std::get<0>(forward("fused::post_pool_bias", false, input, multiplier, negative_slope, kernel_size, stride,
                             padding, dilation, ceil_mode, negative_slope2, bias));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_bias_with_offsets(
    const at::Tensor& input, const at::Tensor& bias, const at::Tensor& multiplier, double negative_slope,
    at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
    bool ceil_mode, std::optional<double> negative_slope2) {
  return forward("fused::post_pool_bias_with_offsets", true, input, multiplier, negative_slope, kernel_size, stride,
                 padding, dilation, ceil_mode, negative_slope2, bias);
}

std::tuple<at::Tensor, at::Tensor> post_pool_backward(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const at::Tensor& multiplier, double negative_slope, std::optional<double> negative_slope2,
    at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool channels_last) {
  auto r = backward("fused::post_pool_backward", grad_output, selected, offsets, std::nullopt, multiplier,
                    negative_slope, negative_slope2, input_size, kernel_size, stride, padding, dilation,
                    channels_last);
  return {std::get<0>(r), std::get<2>(r)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_bias_backward(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets, const at::Tensor& bias,
    const at::Tensor& multiplier, double negative_slope, std::optional<double> negative_slope2,
    at::IntArrayRef input_size, at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, bool channels_last) {
  return backward("fused::post_pool_bias_backward", grad_output, selected, offsets, bias, multiplier,
                  negative_slope, negative_slope2, input_size, kernel_size, stride, padding, dilation, channels_last);
}

// Either backward with launch choices other than the measured defaults (BackwardTuning): for the sweep
// (benchmarks/post_pool/backward_sweep.py) and the tests that compare the forms. CUDA only; no public path calls it.
std::tuple<at::Tensor, at::Tensor, at::Tensor> post_pool_backward_tuned(
    const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& offsets,
    const std::optional<at::Tensor>& bias, const at::Tensor& multiplier, double negative_slope,
    std::optional<double> negative_slope2, at::IntArrayRef input_size, at::IntArrayRef kernel_size,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool channels_last, int64_t cl_items,
    bool dependent_launches, bool single_launch_sum) {
  const char* op = "fused::_post_pool_backward_tuned";
  TORCH_CHECK_VALUE(cl_items == 0 || cl_items == 1 || cl_items == 2 || cl_items == 4 || cl_items == 8, op,
                    ": cl_items must be 0 (the default for the dtype), 1, 2, 4 or 8, got ", cl_items);
  BackwardTuning t;
  t.cl_items = static_cast<int>(cl_items);
  t.dependent_launches = dependent_launches;
  t.single_launch_sum = single_launch_sum;
  return backward(op, grad_output, selected, offsets, bias, multiplier, negative_slope, negative_slope2, input_size,
                  kernel_size, stride, padding, dilation, channels_last, t);
}

void register_kernels(torch::Library& m) {
  m.impl("post_pool", &post_pool);
  m.impl("post_pool_with_offsets", &post_pool_with_offsets);
  m.impl("post_pool_backward", &post_pool_backward);
  m.impl("post_pool_bias", &post_pool_bias);
  m.impl("post_pool_bias_with_offsets", &post_pool_bias_with_offsets);
  m.impl("post_pool_bias_backward", &post_pool_bias_backward);
}

}  // namespace
}  // namespace post_pool
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  fused::post_pool::register_kernels(m);
}

#ifdef WITH_CUDA
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  fused::post_pool::register_kernels(m);
  m.impl("_post_pool_backward_tuned", &fused::post_pool::post_pool_backward_tuned);
}
#endif
