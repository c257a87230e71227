// The host side of the fused convolution's backward at pooled resolution: the three internal ops
//   fused::_conv_transpose3d_post_pool_grad_conv    the convolution output's gradient at the selected taps, and the
//                                                   bias and multiplier gradients
//   fused::_conv_transpose3d_post_pool_grad_weight  the weight's gradient from it
//   fused::_conv_transpose3d_post_pool_grad_input   the input's gradient from it
// for the geometry of the fused kernel (convolution kernel 3, stride 2, padding 1, dilation 1, groups 1,
// output_padding 0 or 1; pool 2x2x2 with stride 2), where every pooled output's window holds the 8 phases of one
// convolution-output 2x2x2 block and its offset names the phase it selected.
//
// On CUDA in float32, bfloat16 and float16 the kernels of csrc/conv_transpose3d_post_pool/backward_contract.h compute
// them without a full-resolution tensor. Everything else (CPU, float64) runs a composite of aten ops: the same
// elementwise formula, then the full-resolution sparse gradient and aten's convolution_backward (the reference the
// tests and CPU-only CI check the ops against).
//
// Outputs, always defined (the fakes in torch_fused_ops/ops/conv_transpose3d_post_pool.py give the same strides):
//   grad_conv: grad_output's sizes with offsets' strides when offsets is contiguous or channels_last_3d (the
//              forward's outputs always are), else contiguous; grad_bias [C]; grad_multiplier in the
//              multiplier's shape, contiguous;
//   grad_weight: [Cin, Cout, 3, 3, 3], contiguous;
//   grad_input: [N, Cin, PD + 1 - output_padding[0], ...], channels_last_3d when grad_conv is channels_last_3d
//               and not contiguous, else contiguous.
//
// Launcher order as in ATen's pooling: checks -> device guard -> allocation -> empty early return -> launch.
// Nothing here reads device memory, so a call never synchronises.
#include "conv_transpose3d_post_pool/checks.h"
#include "post_pool/post_pool.h"

#ifdef WITH_CUDA
#include "conv_transpose3d_post_pool/backward_contract.h"
#endif

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <array>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>

namespace fused {
namespace {

constexpr const char* kGradConvOp = "fused::_conv_transpose3d_post_pool_grad_conv";
constexpr const char* kGradWeightOp = "fused::_conv_transpose3d_post_pool_grad_weight";
constexpr const char* kGradInputOp = "fused::_conv_transpose3d_post_pool_grad_input";
constexpr auto kCL = at::MemoryFormat::ChannelsLast3d;

void check_defined(const char* op, const char* name, const at::Tensor& t) {
  // None reaches a Tensor argument as an undefined tensor.
  TORCH_CHECK_TYPE(t.defined(), op, ": ", name, " must be a Tensor, got None");
  TORCH_CHECK_VALUE(t.layout() == at::kStrided, op, ": ", name, " must be a strided (dense) tensor");
}

bool dense_layout(const at::Tensor& t) {
  return t.is_contiguous() || t.is_contiguous(kCL);
}

// grad_input's memory format (and the full-resolution composite's): channels_last_3d only when grad_conv is
// unambiguously so; a tensor that is both (C = 1, one position) counts as contiguous.
at::MemoryFormat format_of(const at::Tensor& grad_conv) {
  return !grad_conv.is_contiguous() && grad_conv.is_contiguous(kCL) ? kCL : at::MemoryFormat::Contiguous;
}

// grad_conv and offsets as grad_weight and grad_input take them: 5-D pooled tensors of one shape, a floating
// grad_conv, uint8 offsets, one device. Returns the (checked) output_padding.
Int3 check_pooled_pair(const char* op, const at::Tensor& grad_conv, const at::Tensor& offsets,
                       at::IntArrayRef output_padding) {
  check_defined(op, "grad_conv", grad_conv);
  check_defined(op, "offsets", offsets);
  TORCH_CHECK_VALUE(grad_conv.dim() == 5, op, ": expected a 5-D grad_conv (N, C_out, PD, PH, PW), got shape ",
                    shape_str(grad_conv.sizes()));
  TORCH_CHECK_TYPE(at::isFloatingType(grad_conv.scalar_type()), op,
                   ": expected a floating-point grad_conv (float16, bfloat16, float32 or float64), got ",
                   grad_conv.scalar_type());
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kByte, op, ": offsets must be uint8 (2x2x2 windows), got ",
                   offsets.scalar_type());
  TORCH_CHECK_VALUE(offsets.sizes() == grad_conv.sizes(), op, ": offsets ", shape_str(offsets.sizes()),
                    " must have grad_conv's shape ", shape_str(grad_conv.sizes()));
  TORCH_CHECK_VALUE(offsets.device() == grad_conv.device(), op, ": offsets must be on grad_conv's device, got ",
                    offsets.device(), " and ", grad_conv.device());
  TORCH_CHECK_VALUE(output_padding.size() == 1 || output_padding.size() == 3, op,
                    ": output_padding must be a single int or a list of three ints, got ",
                    shape_str(output_padding));
  const Int3 o = output_padding.size() == 1 ? Int3{output_padding[0], output_padding[0], output_padding[0]}
                                            : Int3{output_padding[0], output_padding[1], output_padding[2]};
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(o[i] == 0 || o[i] == 1, op, ": output_padding must be 0 or 1 per dim, got ",
                      at::IntArrayRef(o));
    TORCH_CHECK_VALUE(grad_conv.size(2 + i) + 1 - o[i] >= 1, op, ": grad_conv ", shape_str(grad_conv.sizes()),
                      " with output_padding ", at::IntArrayRef(o), " gives an empty input");
  }
  return o;
}

// The weight/input argument: 5-D, grad_conv's dtype and device.
void check_like_grad_conv(const char* op, const char* name, const at::Tensor& t, const at::Tensor& grad_conv) {
  check_defined(op, name, t);
  TORCH_CHECK_VALUE(t.dim() == 5, op, ": expected a 5-D ", name, ", got shape ", shape_str(t.sizes()));
  TORCH_CHECK_TYPE(t.scalar_type() == grad_conv.scalar_type(), op, ": ", name,
                   " dtype must equal grad_conv dtype, got ", name, " ", t.scalar_type(), " and grad_conv ",
                   grad_conv.scalar_type());
  TORCH_CHECK_VALUE(t.device() == grad_conv.device(), op, ": ", name, " must be on grad_conv's device, got ",
                    t.device(), " and ", grad_conv.device());
}

#ifdef WITH_CUDA
// ---- the CUDA kernels' operands -------------------------------------------------------------------------

bool kernel_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kBFloat16 || t == at::kHalf;
}

// `t` with exactly `ref`'s strides (the launchers take pooled tensors strided alike), copied only if it is not.
at::Tensor strided_like(const at::Tensor& t, const at::Tensor& ref) {
  if (t.strides() == ref.strides()) return t;
  at::Tensor r = at::empty_strided(ref.sizes(), ref.strides(), t.options());
  r.copy_(t);
  return r;
}

// Contiguous or channels_last_3d tensors in place, anything else one contiguous copy.
at::Tensor dense(const at::Tensor& t) {
  return dense_layout(t) ? t : t.contiguous();
}

// grad_conv and offsets strided alike and dense, as the launchers take them.
std::pair<at::Tensor, at::Tensor> kernel_pair(const at::Tensor& grad_conv, const at::Tensor& offsets) {
  const at::Tensor gc = dense_layout(grad_conv) ? grad_conv : grad_conv.contiguous(grad_conv.suggest_memory_format());
  return {gc, strided_like(offsets, gc)};
}
#endif

// ---- the composite (CPU; CUDA float64) ---------------------------------------------------------------------

// The full-resolution gradient of the convolution output: grad_conv at the phase each window selected, zero
// elsewhere (also in the tail row/column that output_padding 0 leaves outside every window).
at::Tensor conv_output_gradient(const at::Tensor& grad_conv, const at::Tensor& offsets, const Int3& o) {
  const int64_t N = grad_conv.size(0), C = grad_conv.size(1);
  const int64_t P[3] = {grad_conv.size(2), grad_conv.size(3), grad_conv.size(4)};
  at::Tensor full = at::zeros({N, C, 2 * P[0] + 1 - o[0], 2 * P[1] + 1 - o[1], 2 * P[2] + 1 - o[2]},
                              grad_conv.options().memory_format(format_of(grad_conv)));
  // [N, C, PD, 2, PH, 2, PW, 2]: window q's phase j at 2q + j.
  at::Tensor windows = full.slice(2, 0, 2 * P[0])
                           .slice(3, 0, 2 * P[1])
                           .slice(4, 0, 2 * P[2])
                           .unflatten(4, {P[2], 2})
                           .unflatten(3, {P[1], 2})
                           .unflatten(2, {P[0], 2});
  const at::Tensor phase = at::arange(8, offsets.options().dtype(at::kLong));
  const at::Tensor hit = offsets.to(at::kLong).unsqueeze(-1) == phase;  // [N, C, PD, PH, PW, 8]
  // where, not a product with the one-hot mask: an infinite gradient must not turn the other phases into NaN.
  const at::Tensor src = at::where(hit, grad_conv.unsqueeze(-1), at::Scalar(0.0)).unflatten(-1, {2, 2, 2});
  windows.copy_(src.permute({0, 1, 2, 5, 3, 6, 4, 7}));
  return full;
}

// aten's convolution_backward of the transposed convolution for one of input (mask 0) or weight (mask 1).
at::Tensor convolution_backward(const at::Tensor& grad_y, const at::Tensor& input, const at::Tensor& weight,
                                const Int3& o, int which) {
  const std::array<bool, 3> mask = {which == 0, which == 1, false};
  auto grads = at::convolution_backward(grad_y, input, weight, std::nullopt, {2, 2, 2}, {1, 1, 1}, {1, 1, 1},
                                        /*transposed=*/true, at::IntArrayRef(o), 1, mask);
  return which == 0 ? std::get<0>(grads) : std::get<1>(grads);
}

void grad_conv_composite(const at::Tensor& grad_output, const at::Tensor& selected, const at::Tensor& multiplier,
                         double s1, double s2, at::Tensor& grad_conv, at::Tensor& grad_bias,
                         at::Tensor& grad_multiplier) {
  // post_pool.h's grad_input_via / grad_multiplier_via op by op in opmath: each aten step rounds as the scalar code
  // does (no FMA: only one operation per step); the mixed form rounds through selected's dtype where they do.
  const auto acc = at::toOpMathType(grad_output.scalar_type());
  const bool mixed = selected.scalar_type() != grad_output.scalar_type();
  const auto mid = [&](const at::Tensor& t) { return mixed ? t.to(selected.scalar_type()).to(acc) : t; };
  const int64_t C = grad_output.size(1);
  const at::Tensor flat = post_pool::flat_multiplier(multiplier).to(acc);
  const at::Tensor m = flat.numel() == 1 ? flat.reshape({}) : flat.view({1, C, 1, 1, 1});
  const at::Tensor x = selected.to(acc);
  const at::Tensor g = grad_output.to(acc).add(0);  // eager accumulates into zeros: -0 becomes +0
  const at::Tensor y1 = mid(at::where(x > 0, x, x.mul(s1)));
  const at::Tensor y2 = y1.mul(m);
  const at::Tensor gy2 = at::where(y2 > 0, g, g.mul(s2));
  const at::Tensor gy1 = mid(gy2.mul(m));
  grad_conv.copy_(at::where(x > 0, gy1, gy1.mul(s1)));
  grad_bias = grad_conv.to(acc).sum(at::IntArrayRef({0, 2, 3, 4})).to(selected.scalar_type());
  grad_multiplier = post_pool::reduce_grad_multiplier(gy2.mul(y1), multiplier);
}

// ---- the ops -----------------------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv_transpose3d_post_pool_grad_conv(const at::Tensor& grad_output,
                                                            const at::Tensor& selected, const at::Tensor& offsets,
                                                            const at::Tensor& multiplier, double negative_slope,
                                                            std::optional<double> negative_slope2) {
  const char* op = kGradConvOp;
  check_defined(op, "grad_output", grad_output);
  check_defined(op, "selected", selected);
  check_defined(op, "offsets", offsets);
  check_defined(op, "multiplier", multiplier);
  post_pool::check_saved_pooled(op, grad_output, selected, offsets);
  TORCH_CHECK_TYPE(offsets.scalar_type() == at::kByte, op, ": offsets must be uint8 (2x2x2 windows), got ",
                   offsets.scalar_type());
  // post_pool's own checks of the dtype and the multiplier (one element, or C along the channel dim), with a
  // kernel of 1 so that grad_output's sizes are the pooled ones. The convolution's dtype is selected's;
  // grad_output has the output's (float32 in the mixed form).
  const at::ScalarType dtype = selected.scalar_type();
  post_pool::check_post_pool_sizes(op, grad_output.sizes(), dtype, grad_output.device(), multiplier,
                                   {1}, {}, {0}, {1}, false, false);
  const at::ScalarType out_dtype = post_pool::output_dtype(dtype, multiplier.scalar_type());
  TORCH_CHECK_TYPE(grad_output.scalar_type() == out_dtype, op, ": grad_output must be ", out_dtype,
                   " (the forward output's dtype for a ", dtype, " convolution and a ", multiplier.scalar_type(),
                   " multiplier), got ", grad_output.scalar_type());
  post_pool::check_slopes(op, dtype, negative_slope, negative_slope2);
  const double s2 = negative_slope2.value_or(negative_slope);

  const c10::DeviceGuard guard(grad_output.device());
  // grad_conv and grad_bias in the convolution's dtype, grad_multiplier in the multiplier's.
  const auto options = selected.options();
  const auto m_options = multiplier.options();
  at::Tensor grad_conv = dense_layout(offsets) ? at::empty_strided(offsets.sizes(), offsets.strides(), options)
                                               : at::empty(offsets.sizes(), options);
  const int64_t C = grad_output.size(1);
  if (grad_conv.numel() == 0) {
    return {grad_conv, at::zeros({C}, options), at::zeros(multiplier.sizes(), m_options)};
  }
  at::Tensor grad_bias, grad_multiplier;
#ifdef WITH_CUDA
  if (grad_output.is_cuda() && kernel_dtype(dtype)) {
    grad_bias = at::empty({C}, options);
    grad_multiplier = at::empty(multiplier.sizes(), m_options);
    const at::Tensor m = multiplier.is_contiguous() ? multiplier : post_pool::flat_multiplier(multiplier);
    launch_conv_transpose3d_post_pool_grad_conv_cuda(
        strided_like(grad_output, grad_conv), strided_like(selected, grad_conv), strided_like(offsets, grad_conv), m,
        negative_slope, s2, grad_conv, grad_bias, grad_multiplier);
    return {grad_conv, grad_bias, grad_multiplier};
  }
#endif
  grad_conv_composite(grad_output, selected, multiplier, negative_slope, s2, grad_conv, grad_bias, grad_multiplier);
  return {grad_conv, grad_bias, grad_multiplier};
}

at::Tensor conv_transpose3d_post_pool_grad_weight(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                                  const at::Tensor& input, at::IntArrayRef output_padding) {
  const char* op = kGradWeightOp;
  const Int3 o = check_pooled_pair(op, grad_conv, offsets, output_padding);
  check_like_grad_conv(op, "input", input, grad_conv);
  bool fits = input.size(0) == grad_conv.size(0);
  for (int i = 0; i < 3; ++i) fits = fits && input.size(2 + i) == grad_conv.size(2 + i) + 1 - o[i];
  TORCH_CHECK_VALUE(fits, op, ": input ", shape_str(input.sizes()), " does not fit grad_conv ",
                    shape_str(grad_conv.sizes()), " with output_padding ", at::IntArrayRef(o),
                    " (N equal, and D = PD + 1 - output_padding per dim)");

  const c10::DeviceGuard guard(grad_conv.device());
  at::Tensor grad_weight = at::empty({input.size(1), grad_conv.size(1), 3, 3, 3}, grad_conv.options());
  if (grad_weight.numel() == 0) return grad_weight;
  if (grad_conv.numel() == 0) return grad_weight.zero_();  // an empty sum
#ifdef WITH_CUDA
  if (grad_conv.is_cuda() && kernel_dtype(grad_conv.scalar_type()) &&
      conv_transpose3d_post_pool_grad_weight_cuda_fits(grad_conv)) {
    const auto [gc, off] = kernel_pair(grad_conv, offsets);
    launch_conv_transpose3d_post_pool_grad_weight_cuda(gc, off, dense(input), o, conv_allows_tf32(), grad_weight);
    return grad_weight;
  }
#endif
  // The weight's values are not read for the weight's gradient; only its shape is.
  const at::Tensor weight = at::zeros(grad_weight.sizes(), grad_conv.options());
  grad_weight.copy_(convolution_backward(conv_output_gradient(grad_conv, offsets, o), input, weight, o, 1));
  return grad_weight;
}

at::Tensor conv_transpose3d_post_pool_grad_input(const at::Tensor& grad_conv, const at::Tensor& offsets,
                                                 const at::Tensor& weight, at::IntArrayRef output_padding) {
  const char* op = kGradInputOp;
  const Int3 o = check_pooled_pair(op, grad_conv, offsets, output_padding);
  check_like_grad_conv(op, "weight", weight, grad_conv);
  TORCH_CHECK_VALUE(weight.size(1) == grad_conv.size(1) && weight.size(2) == 3 && weight.size(3) == 3 &&
                        weight.size(4) == 3,
                    op, ": weight must be [C_in, ", grad_conv.size(1), ", 3, 3, 3] for grad_conv ",
                    shape_str(grad_conv.sizes()), ", got ", shape_str(weight.sizes()));

  const c10::DeviceGuard guard(grad_conv.device());
  const at::MemoryFormat format = format_of(grad_conv);
  at::Tensor grad_input =
      at::empty({grad_conv.size(0), weight.size(0), grad_conv.size(2) + 1 - o[0], grad_conv.size(3) + 1 - o[1],
                 grad_conv.size(4) + 1 - o[2]},
                grad_conv.options().memory_format(format));
  if (grad_input.numel() == 0) return grad_input;
  if (grad_conv.numel() == 0) return grad_input.zero_();  // C_out = 0: an empty sum
#ifdef WITH_CUDA
  if (grad_conv.is_cuda() && kernel_dtype(grad_conv.scalar_type()) &&
      conv_transpose3d_post_pool_grad_input_cuda_fits(grad_conv.scalar_type(), grad_conv.size(1),
                                                      grad_conv.get_device())) {
    const auto [gc, off] = kernel_pair(grad_conv, offsets);
    launch_conv_transpose3d_post_pool_grad_input_cuda(gc, off, dense(weight), o, conv_allows_tf32(), grad_input);
    return grad_input;
  }
#endif
  // The input's values are not read for the input's gradient; only its shape (and layout) are.
  const at::Tensor input = at::empty(grad_input.sizes(), grad_input.options());
  grad_input.copy_(convolution_backward(conv_output_gradient(grad_conv, offsets, o), input, weight, o, 0));
  return grad_input;
}

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, CPU, m) {
  m.impl("_conv_transpose3d_post_pool_grad_conv", &fused::conv_transpose3d_post_pool_grad_conv);
  m.impl("_conv_transpose3d_post_pool_grad_weight", &fused::conv_transpose3d_post_pool_grad_weight);
  m.impl("_conv_transpose3d_post_pool_grad_input", &fused::conv_transpose3d_post_pool_grad_input);
}

// Registered in every build: without the CUDA kernels compiled in, CUDA tensors run the composite.
TORCH_LIBRARY_IMPL(fused, CUDA, m) {
  m.impl("_conv_transpose3d_post_pool_grad_conv", &fused::conv_transpose3d_post_pool_grad_conv);
  m.impl("_conv_transpose3d_post_pool_grad_weight", &fused::conv_transpose3d_post_pool_grad_weight);
  m.impl("_conv_transpose3d_post_pool_grad_input", &fused::conv_transpose3d_post_pool_grad_input);
}
