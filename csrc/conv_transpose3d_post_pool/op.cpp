// The CPU and CUDA kernels of fused::conv_transpose3d_post_pool and its training form _with_offsets:
//   post_pool(conv_transpose3d(input, weight, bias, ...), multiplier, ...)
// On CUDA, where fused_kernel_unsupported_reason finds no reason, one fused kernel
// (csrc/conv_transpose3d_post_pool/contract.h) computes the convolution at pooled resolution and never writes its
// full-resolution output. Everything else, and CPU, runs the composite: aten's convolution, then
// fused::post_pool[_with_offsets].
//
// Launcher order as in ATen's pooling: checks -> device guard -> allocation -> empty early return -> launch. The
// host path never reads device memory (no .item(), no data-dependent shapes), so it never synchronises and can be
// captured in a CUDA graph.
#include "conv_transpose3d_post_pool/checks.h"

#ifdef WITH_CUDA
#include "conv_transpose3d_post_pool/contract.h"
#endif

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fused {
namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using PostPoolSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);
using PostPoolTrainingSig = Outputs(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                                    at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);

constexpr const char* kOp = "fused::conv_transpose3d_post_pool";
constexpr const char* kOpWithOffsets = "fused::conv_transpose3d_post_pool_with_offsets";

template <typename Sig>
c10::TypedOperatorHandle<Sig> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}

// The tensors the fused kernel reads: input and weight in place when contiguous or channels_last_3d (else one
// copy into the output's format), bias contiguous 1-D, multiplier as its 1 or Cout contiguous elements.
at::Tensor in_kernel_layout(const at::Tensor& t, at::MemoryFormat format) {
  if (t.is_contiguous() || t.is_contiguous(at::MemoryFormat::ChannelsLast3d)) return t;
  return t.contiguous(format);
}

// The composite: aten's convolution (whose output already has the op's memory format), then post_pool.
Outputs composite(bool with_offsets, const ConvTranspose3dPostPoolGeometry& g, const at::Tensor& input,
                  const at::Tensor& weight, const std::optional<at::Tensor>& bias, const at::Tensor& multiplier,
                  double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                  at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode,
                  std::optional<double> negative_slope2) {
  const at::Tensor y = at::convolution(input, weight, bias, g.stride, g.padding, g.dilation, /*transposed=*/true,
                                       g.output_padding, g.groups);
  // post_pool gives the memory format of its input, so y's layout carries through; .contiguous(format) is a
  // no-op then, and only guards the op's documented layout.
  if (!with_offsets) {
    static const auto post_pool = op_handle<PostPoolSig>("fused::post_pool");
    at::Tensor out = post_pool.call(y, multiplier, negative_slope, kernel_size, pool_stride, pool_padding,
                                    pool_dilation, ceil_mode, negative_slope2);
    return {out.contiguous(g.format), at::Tensor(), at::Tensor()};
  }
  static const auto training = op_handle<PostPoolTrainingSig>("fused::post_pool_with_offsets");
  auto [out, selected, offsets] = training.call(y, multiplier, negative_slope, kernel_size, pool_stride, pool_padding,
                                                pool_dilation, ceil_mode, negative_slope2);
  return {out.contiguous(g.format), selected.contiguous(g.format), offsets.contiguous(g.format)};
}

#ifdef WITH_CUDA
Outputs fused_cuda(bool with_offsets, const ConvTranspose3dPostPoolGeometry& g, const at::Tensor& input,
                   const at::Tensor& weight, const std::optional<at::Tensor>& bias, const at::Tensor& multiplier,
                   double negative_slope, std::optional<double> negative_slope2) {
  const c10::DeviceGuard guard(input.device());
  const auto options = input.options().memory_format(g.format);
  const auto size = g.pooled_size();
  // The mixed form (a float32 multiplier for a float16/bfloat16 input) writes its output in float32.
  at::Tensor out =
      at::empty(size, options.dtype(post_pool::output_dtype(input.scalar_type(), multiplier.scalar_type())));
  at::Tensor selected, offsets;
  if (with_offsets) {
    selected = at::empty(size, options);
    offsets = at::empty(size, options.dtype(g.pool.offset_dtype()));
  }
  if (out.numel() == 0) return {out, selected, offsets};
  const at::Tensor b = bias.has_value() && bias->defined() ? bias->contiguous() : at::Tensor();
  // The kernel reads the multiplier's 1 or Cout elements in order: a contiguous one is passed as it is (no view
  // to make on every call).
  const at::Tensor m = multiplier.is_contiguous() ? multiplier : post_pool::flat_multiplier(multiplier);
  launch_conv_transpose3d_post_pool_cuda(in_kernel_layout(input, g.format), in_kernel_layout(weight, g.format), b,
                                         m, negative_slope,
                                         negative_slope2.value_or(negative_slope), g.output_padding,
                                         conv_allows_tf32(), out, selected, offsets);
  return {out, selected, offsets};
}

// _conv_transpose3d_post_pool_cast's fused path: float32 input, weight and bias rounded to `dtype` by the kernel, a
// float32 multiplier of at least one dim (the mixed form: output float32), where the kernel takes that problem.
// Returns an undefined tensor where it does not (the caller casts instead). The kernel's own rule (GPU, build, size)
// goes first, so that where it says no the op's checks run once, in the call the caller makes. The checks are the
// op's own on the float32 operands: none of them depends on the operands' dtype once the multiplier's matches.
at::Tensor fused_cuda_rounding(const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, at::ScalarType dtype, at::IntArrayRef stride,
                               at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                               at::IntArrayRef dilation, const at::Tensor& multiplier, double negative_slope,
                               at::IntArrayRef kernel_size, at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                               at::IntArrayRef pool_dilation, bool ceil_mode, std::optional<double> negative_slope2) {
  const bool has_bias = bias.has_value() && bias->defined();
  if ((dtype != at::kBFloat16 && dtype != at::kHalf) || !input.is_cuda() || input.scalar_type() != at::kFloat ||
      weight.scalar_type() != at::kFloat || (has_bias && bias->scalar_type() != at::kFloat) ||
      multiplier.scalar_type() != at::kFloat || multiplier.dim() == 0) {
    return at::Tensor();
  }
  // output_padding as the fused kernel takes it (one value or three, each 0 or 1); anything else is the caller's.
  if (input.dim() != 5 || weight.dim() != 5 || (output_padding.size() != 1 && output_padding.size() != 3)) {
    return at::Tensor();
  }
  for (const int64_t op : output_padding) {
    if (op != 0 && op != 1) return at::Tensor();
  }
  if (!conv_transpose3d_post_pool_cuda_rounds_operands(dtype, input)) return at::Tensor();
  const ConvTranspose3dPostPoolGeometry g =
      check_conv_transpose3d_post_pool_args(kOp, input, weight, bias, stride, padding, output_padding, groups,
                                            dilation, multiplier, kernel_size, pool_stride, pool_padding,
                                            pool_dilation, ceil_mode);
  if (fused_kernel_unsupported_reason(input, weight, g) != nullptr ||
      !conv_transpose3d_post_pool_cuda_fits(dtype, input.size(1), input.get_device())) {
    return at::Tensor();
  }
  const c10::DeviceGuard guard(input.device());
  at::Tensor out = at::empty(g.pooled_size(), input.options().memory_format(g.format).dtype(at::kFloat));
  if (out.numel() == 0) return out;
  const at::Tensor b = has_bias ? bias->contiguous() : at::Tensor();
  const at::Tensor m = multiplier.is_contiguous() ? multiplier : post_pool::flat_multiplier(multiplier);
  launch_conv_transpose3d_post_pool_cuda(in_kernel_layout(input, g.format), in_kernel_layout(weight, g.format), b,
                                         m, negative_slope, negative_slope2.value_or(negative_slope),
                                         g.output_padding, conv_allows_tf32(), out, at::Tensor(), at::Tensor(),
                                         dtype);
  return out;
}
#endif

Outputs forward(bool with_offsets, bool on_cuda, const at::Tensor& input, const at::Tensor& weight,
                const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation, const at::Tensor& multiplier,
                double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode,
                std::optional<double> negative_slope2) {
  const ConvTranspose3dPostPoolGeometry g = check_conv_transpose3d_post_pool_args(
      with_offsets ? kOpWithOffsets : kOp, input, weight, bias, stride, padding, output_padding, groups, dilation,
      multiplier, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode);
#ifdef WITH_CUDA
  // Where the kernel's shared memory does not fit the GPU, the composite runs (the backward stays at pooled
  // resolution either way: it needs only the selected values and offsets, which both produce).
  if (on_cuda && fused_kernel_unsupported_reason(input, weight, g) == nullptr &&
      conv_transpose3d_post_pool_cuda_fits(input.scalar_type(), input.size(1), input.get_device())) {
    return fused_cuda(with_offsets, g, input, weight, bias, multiplier, negative_slope, negative_slope2);
  }
#else
  (void)on_cuda;
#endif
  return composite(with_offsets, g, input, weight, bias, multiplier, negative_slope, kernel_size, pool_stride,
                   pool_padding, pool_dilation, ceil_mode, negative_slope2);
}

template <bool kCuda>
at::Tensor conv_transpose3d_post_pool_forward(const at::Tensor& input, const at::Tensor& weight,
                                              const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                              at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                                              at::IntArrayRef dilation, const at::Tensor& multiplier,
                                              double negative_slope, at::IntArrayRef kernel_size,
                                              at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                                              at::IntArrayRef pool_dilation, bool ceil_mode,
                                              std::optional<double> negative_slope2) {
  return std::get<0>(forward(false, kCuda, input, weight, bias, stride, padding, output_padding, groups, dilation,
                             multiplier, negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation,
                             ceil_mode, negative_slope2));
}

template <bool kCuda>
Outputs conv_transpose3d_post_pool_with_offsets_forward(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
                                    at::IntArrayRef dilation, const at::Tensor& multiplier, double negative_slope,
                                    at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                                    at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode,
                                    std::optional<double> negative_slope2) {
  return forward(true, kCuda, input, weight, bias, stride, padding, output_padding, groups, dilation, multiplier,
                 negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode, negative_slope2);
}

// conv_transpose3d_post_pool on the operands cast to `dtype`: in one kernel where the fused CUDA kernel rounds them
// itself, else the casts (at::Tensor::to, as autocast casts) and the op.
template <bool kCuda>
at::Tensor conv_transpose3d_post_pool_cast_forward(const at::Tensor& input, const at::Tensor& weight,
                                                   const std::optional<at::Tensor>& bias, at::ScalarType dtype,
                                                   at::IntArrayRef stride, at::IntArrayRef padding,
                                                   at::IntArrayRef output_padding, int64_t groups,
                                                   at::IntArrayRef dilation, const at::Tensor& multiplier,
                                                   double negative_slope, at::IntArrayRef kernel_size,
                                                   at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                                                   at::IntArrayRef pool_dilation, bool ceil_mode,
                                                   std::optional<double> negative_slope2) {
#ifdef WITH_CUDA
  if (kCuda) {
    at::Tensor out = fused_cuda_rounding(input, weight, bias, dtype, stride, padding, output_padding, groups,
                                         dilation, multiplier, negative_slope, kernel_size, pool_stride, pool_padding,
                                         pool_dilation, ceil_mode, negative_slope2);
    if (out.defined()) return out;
  }
#endif
  std::optional<at::Tensor> b;
  if (bias.has_value() && bias->defined()) b = bias->to(dtype);
  return conv_transpose3d_post_pool_forward<kCuda>(input.to(dtype), weight.to(dtype), b, stride, padding,
                                                   output_padding, groups, dilation, multiplier, negative_slope,
                                                   kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                                                   negative_slope2);
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("conv_transpose3d_post_pool", &fused::conv_transpose3d_post_pool_forward<false>);
  m.impl("conv_transpose3d_post_pool_with_offsets", &fused::conv_transpose3d_post_pool_with_offsets_forward<false>);
  m.impl("_conv_transpose3d_post_pool_cast", &fused::conv_transpose3d_post_pool_cast_forward<false>);
}

// Registered in every build: without the CUDA kernels compiled in, CUDA tensors run the composite.
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("conv_transpose3d_post_pool", &fused::conv_transpose3d_post_pool_forward<true>);
  m.impl("conv_transpose3d_post_pool_with_offsets", &fused::conv_transpose3d_post_pool_with_offsets_forward<true>);
  m.impl("_conv_transpose3d_post_pool_cast", &fused::conv_transpose3d_post_pool_cast_forward<true>);
}
