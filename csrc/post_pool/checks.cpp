// Host-side code shared by the CPU and CUDA launchers: the one place where fused::post_pool's arguments are
// validated (so both devices raise the same exceptions with the same messages), the input layout decision, and
// the final reduction of the multiplier gradient. torch_fused_ops/ops/common.py mirrors the checks for the fake
// (meta) impls.
#include "common/cpu_huge_pages.h"
#include "post_pool/post_pool.h"
#include "post_pool/launchers.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <utility>

namespace fused {
namespace post_pool {

namespace {

int64_t pooled_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  // max_pool3d's formula (ATen pooling_output_shape): floor division, and in ceil mode the last window must
  // start inside the input or the left padding.
  const int64_t num = in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
  int64_t out = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

void check_pool_params(const char* op, const std::array<int64_t, 3>& k, const std::array<int64_t, 3>& s,
                       const std::array<int64_t, 3>& p, const std::array<int64_t, 3>& d) {
  // max_pool3d converts each pool parameter to int before any other check and raises (RuntimeError) on
  // overflow; so do we, with its words.
  const std::pair<const char*, const std::array<int64_t, 3>*> params[] = {
      {"kernel_size", &k}, {"stride", &s}, {"padding", &p}, {"dilation", &d}};
  for (const auto& [name, v] : params) {
    for (int i = 0; i < 3; ++i) {
      TORCH_CHECK((*v)[i] >= std::numeric_limits<int32_t>::min() && (*v)[i] <= std::numeric_limits<int32_t>::max(),
                  op, ": ", name, " ", (*v)[0], "x", (*v)[1], "x", (*v)[2],
                  ": value cannot be converted to type int without overflow");
    }
  }
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(k[i] > 0, op, ": kernel_size must be positive, got ", k[0], "x", k[1], "x", k[2]);
    TORCH_CHECK_VALUE(s[i] > 0, op, ": stride must be positive, got ", s[0], "x", s[1], "x", s[2]);
    TORCH_CHECK_VALUE(d[i] > 0, op, ": dilation must be positive, got ", d[0], "x", d[1], "x", d[2]);
    TORCH_CHECK_VALUE(p[i] >= 0, op, ": padding must be non-negative, got ", p[0], "x", p[1], "x", p[2]);
    TORCH_CHECK_VALUE(p[i] <= k[i] / 2, op, ": padding must be at most half of kernel_size, got padding ", p[0], "x",
                      p[1], "x", p[2], " for kernel_size ", k[0], "x", k[1], "x", k[2]);
  }
  // Window offsets are int32 (uint8 up to 256 taps). max_pool3d has no such limit (its indices address the input),
  // so this is the one pool max_pool3d accepts and we do not.
  TORCH_CHECK_VALUE(k[0] * k[1] <= std::numeric_limits<int32_t>::max() / k[2], op, ": kernel_size ", k[0], "x", k[1],
                    "x", k[2], " has more than 2**31 - 1 taps per window, which the window offsets (int32) cannot "
                    "address");
}

}  // namespace

at::MemoryFormat output_memory_format(const at::Tensor& input) {
  return input.suggest_memory_format() == at::MemoryFormat::ChannelsLast3d ? at::MemoryFormat::ChannelsLast3d
                                                                            : at::MemoryFormat::Contiguous;
}

at::Tensor flat_multiplier(const at::Tensor& multiplier) {
  return multiplier.reshape({-1}).contiguous();
}

namespace {

bool is_exact_tiling(const PoolGeometry& g) {
  return g.pd == 0 && g.ph == 0 && g.pw == 0 && g.dd == 1 && g.dh == 1 && g.dw == 1 && g.sd == g.kd &&
         g.sh == g.kh && g.sw == g.kw && g.OD * g.kd <= g.D && g.OH * g.kh <= g.H && g.OW * g.kw <= g.W;
}

// Checks shared by forward and backward: dtype, device, multiplier shape, pool parameters. Output sizes are
// left for the caller.
PoolGeometry check_common(const char* op, at::IntArrayRef sizes, at::ScalarType dtype, at::Device device,
                          const at::Tensor& multiplier, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                          at::IntArrayRef padding, at::IntArrayRef dilation) {
  TORCH_CHECK_VALUE(sizes.size() == 5, op, ": expected a 5-D input (N, C, D, H, W), got ", sizes.size(),
                    "-D input of shape ", shape_str(sizes));
  TORCH_CHECK_TYPE(at::isFloatingType(dtype), op,
                   ": expected a floating-point input (float16, bfloat16, float32 or float64), got ", dtype);
  TORCH_CHECK_TYPE(multiplier.scalar_type() == dtype || is_mixed(dtype, multiplier.scalar_type()), op,
                   ": multiplier dtype must equal input dtype, or be float32 for a float16/bfloat16 input (the "
                   "mixed precision torch.autocast computes), got multiplier ",
                   multiplier.scalar_type(), " and input ", dtype);
  // Eager's type promotion lets a 0-dim tensor promote nothing (input * it keeps the input's dtype), so the mixed
  // form needs a multiplier of at least one dim.
  TORCH_CHECK_TYPE(multiplier.scalar_type() == dtype || multiplier.dim() > 0, op, ": a 0-dim ",
                   multiplier.scalar_type(), " multiplier does not promote a ", dtype,
                   " input (eager keeps the input's dtype); give it the input's dtype or a shape such as (1,)");
  TORCH_CHECK_VALUE(multiplier.device() == device, op,
                    ": multiplier must be on the input's device, got multiplier on ", multiplier.device(),
                    " and input on ", device);
  TORCH_CHECK_VALUE(multiplier.layout() == at::kStrided, op, ": sparse multipliers are not supported");

  // The multiplier may vary only along the channel dim once broadcast against the input.
  const int64_t C = sizes[1];
  const int64_t mdim = multiplier.dim();
  bool ok = mdim <= 5;
  if (ok && multiplier.numel() != 1) {
    for (int64_t i = 0; i < mdim; ++i) {
      const int64_t input_dim = 5 - mdim + i;  // right-aligned, as broadcasting does
      const int64_t sz = multiplier.size(i);
      if (sz == 1) continue;
      if (input_dim != 1 || sz != C) ok = false;
    }
  }
  TORCH_CHECK_VALUE(ok, op, ": multiplier of shape ", shape_str(multiplier.sizes()),
                    " must broadcast against input of shape ", shape_str(sizes),
                    " varying at most along the channel dim: one element, or C=", C,
                    " elements shaped (C, 1, 1, 1) or (1, C, 1, 1, 1)");

  const auto k = expand3(op, "kernel_size", kernel_size, {0, 0, 0}, false);
  const auto s = expand3(op, "stride", stride, k, true);
  const auto p = expand3(op, "padding", padding, {0, 0, 0}, false);
  const auto d = expand3(op, "dilation", dilation, {1, 1, 1}, false);
  check_pool_params(op, k, s, p, d);

  PoolGeometry g;
  g.N = sizes[0];
  g.C = C;
  g.D = sizes[2];
  g.H = sizes[3];
  g.W = sizes[4];
  TORCH_CHECK_VALUE(g.N >= 0 && g.C >= 0, op, ": negative sizes in input shape ", shape_str(sizes));
  TORCH_CHECK_VALUE(g.D > 0 && g.H > 0 && g.W > 0, op,
                    ": expected non-empty spatial dims (D, H, W), got input of shape ", shape_str(sizes));
  g.kd = k[0]; g.kh = k[1]; g.kw = k[2];
  g.sd = s[0]; g.sh = s[1]; g.sw = s[2];
  g.pd = p[0]; g.ph = p[1]; g.pw = p[2];
  g.dd = d[0]; g.dh = d[1]; g.dw = d[2];
  return g;
}

}  // namespace

PoolGeometry check_post_pool_sizes(const char* op, at::IntArrayRef sizes, at::ScalarType dtype, at::Device device,
                                   const at::Tensor& multiplier, at::IntArrayRef kernel_size, at::IntArrayRef stride,
                                   at::IntArrayRef padding, at::IntArrayRef dilation, bool ceil_mode,
                                   bool channels_last) {
  PoolGeometry g = check_common(op, sizes, dtype, device, multiplier, kernel_size, stride, padding, dilation);
  g.OD = pooled_size(op, g.D, g.kd, g.sd, g.pd, g.dd, ceil_mode);
  g.OH = pooled_size(op, g.H, g.kh, g.sh, g.ph, g.dh, ceil_mode);
  g.OW = pooled_size(op, g.W, g.kw, g.sw, g.pw, g.dw, ceil_mode);
  TORCH_CHECK_VALUE(g.OD >= 1 && g.OH >= 1 && g.OW >= 1, op, ": output size is too small: input ",
                    shape_str(sizes), " gives pooled size ", g.OD, "x", g.OH, "x", g.OW);
  g.channels_last = channels_last;
  g.exact_tiling = is_exact_tiling(g);
  return g;
}

PoolGeometry check_post_pool_args(const char* op, const at::Tensor& input, const at::Tensor& multiplier,
                                  at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                                  at::IntArrayRef dilation, bool ceil_mode) {
  TORCH_CHECK_VALUE(input.layout() == at::kStrided, op, ": sparse inputs are not supported");
  return check_post_pool_sizes(op, input.sizes(), input.scalar_type(), input.device(), multiplier, kernel_size,
                               stride, padding, dilation, ceil_mode,
                               output_memory_format(input) == at::MemoryFormat::ChannelsLast3d);
}

void check_saved_pooled(const char* op, const at::Tensor& grad_output, const at::Tensor& selected,
                        const at::Tensor& offsets) {
  TORCH_CHECK_VALUE(grad_output.dim() == 5 && selected.sizes() == grad_output.sizes() &&
                        offsets.sizes() == grad_output.sizes(),
                    op, ": grad_output ", shape_str(grad_output.sizes()), ", selected ", shape_str(selected.sizes()),
                    " and offsets ", shape_str(offsets.sizes()), " must be 5-D with equal shapes");
  TORCH_CHECK_TYPE(selected.scalar_type() == grad_output.scalar_type() ||
                       is_mixed(selected.scalar_type(), grad_output.scalar_type()),
                   op, ": grad_output and selected must share one dtype (or be float32 and float16/bfloat16: the "
                   "mixed form), got ", grad_output.scalar_type(), " and ", selected.scalar_type());
  TORCH_CHECK_VALUE(selected.device() == grad_output.device() && offsets.device() == grad_output.device(), op,
                    ": grad_output, selected and offsets must be on one device");
}

PoolGeometry check_post_pool_backward_args(const at::Tensor& grad_output, const at::Tensor& selected,
                                           const at::Tensor& offsets, const at::Tensor& multiplier,
                                           at::IntArrayRef input_size, at::IntArrayRef kernel_size,
                                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                           bool channels_last) {
  const char* op = "fused::post_pool_backward";
  check_saved_pooled(op, grad_output, selected, offsets);
  PoolGeometry g = check_common(op, input_size, selected.scalar_type(), grad_output.device(), multiplier,
                                kernel_size, stride, padding, dilation);
  const at::ScalarType out_dtype = output_dtype(selected.scalar_type(), multiplier.scalar_type());
  TORCH_CHECK_TYPE(grad_output.scalar_type() == out_dtype, op, ": grad_output must be ", out_dtype,
                   " (the forward output's dtype for a ", selected.scalar_type(), " input and a ",
                   multiplier.scalar_type(), " multiplier), got ", grad_output.scalar_type());
  // ceil_mode is not an argument here: the pooled sizes come from grad_output.
  g.OD = grad_output.size(2);
  g.OH = grad_output.size(3);
  g.OW = grad_output.size(4);
  TORCH_CHECK_VALUE(grad_output.size(0) == g.N && grad_output.size(1) == g.C && g.OD >= 1 && g.OH >= 1 && g.OW >= 1,
                    op, ": grad_output ", shape_str(grad_output.sizes()), " does not fit input_size ",
                    shape_str(input_size));
  TORCH_CHECK_TYPE(offsets.scalar_type() == g.offset_dtype(), op, ": offsets must be ", g.offset_dtype(),
                   " for a window of ", g.window_volume(), " taps, got ", offsets.scalar_type());
  g.channels_last = channels_last;
  g.exact_tiling = is_exact_tiling(g);
  return g;
}

void check_slopes(const char* op, at::ScalarType dtype, double s1, std::optional<double> s2) {
  if (dtype == at::kDouble) return;  // computed in double: every double slope is representable
  // Eager leaky_relu converts its slope to float (the op-math type of float32, bfloat16 and float16 inputs) and
  // raises on a finite value outside float's range; infinities and NaN convert.
  constexpr double kMax = std::numeric_limits<float>::max();
  const std::pair<const char*, std::optional<double>> slopes[] = {{"negative_slope", s1},
                                                                  {"negative_slope2", s2}};
  for (const auto& [name, v] : slopes) {
    TORCH_CHECK(!v.has_value() || !std::isfinite(*v) || std::abs(*v) <= kMax, op, ": ", name, " ", *v, " for a ", dtype,
                " input: value cannot be converted to type float without overflow");
  }
}

void check_bias(const char* op, const at::Tensor& bias, int64_t C, at::ScalarType dtype, at::Device device) {
  TORCH_CHECK_TYPE(bias.scalar_type() == dtype, op, ": bias dtype must equal input dtype, got bias ",
                   bias.scalar_type(), " and input ", dtype);
  TORCH_CHECK_VALUE(bias.device() == device, op, ": bias must be on the input's device, got bias on ",
                    bias.device(), " and input on ", device);
  TORCH_CHECK_VALUE(bias.dim() == 1 && bias.size(0) == C, op, ": bias must be 1-D with C=", C,
                    " elements, got shape ", shape_str(bias.sizes()));
}

ForwardInputs prepare_forward(const char* op, const at::Tensor& input, const at::Tensor& multiplier,
                             at::IntArrayRef kernel_size, at::IntArrayRef stride, at::IntArrayRef padding,
                             at::IntArrayRef dilation, bool ceil_mode, double negative_slope,
                             std::optional<double> negative_slope2, const std::optional<at::Tensor>& bias) {
  ForwardInputs f;
  f.g = check_post_pool_args(op, input, multiplier, kernel_size, stride, padding, dilation, ceil_mode);
  if (bias.has_value()) {
    check_bias(op, *bias, f.g.C, input.scalar_type(), input.device());
    f.bias = bias->contiguous();
  }
  f.format = f.g.channels_last ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  // Contiguous and channels_last_3d inputs are used in place; anything else is copied into the output's format.
  f.input = input.contiguous(f.format);
  check_slopes(op, input.scalar_type(), negative_slope, negative_slope2);
  f.multiplier = flat_multiplier(multiplier);
  f.s1 = negative_slope;
  f.s2 = negative_slope2.has_value() ? *negative_slope2 : negative_slope;
  return f;
}

at::Tensor reduce_grad_multiplier(const at::Tensor& contrib, const at::Tensor& multiplier) {
  // contrib: per-output contributions (N, C, OD, OH, OW) in the op-math dtype; sum everything but channels.
  at::Tensor per_channel = contrib.numel() == 0 ? at::zeros({contrib.size(1)}, contrib.options())
                                                : contrib.sum(at::IntArrayRef({0, 2, 3, 4}));
  at::Tensor total = multiplier.numel() == 1 ? per_channel.sum() : per_channel;
  return total.reshape(multiplier.sizes()).to(multiplier.scalar_type()).contiguous();
}

GradPartials alloc_grad_partials(const BackwardInputs& b) {
  const auto opts = b.grad_output.options().dtype(at::toOpMathType(b.grad_output.scalar_type()))
                        .memory_format(b.format);
  GradPartials p;
  p.multiplier = at::empty(b.grad_output.sizes(), opts);
  advise_huge_pages(p.multiplier);
  if (b.bias.defined()) {
    p.bias = at::empty(b.grad_output.sizes(), opts);
    advise_huge_pages(p.bias);
  }
  return p;
}

ParamGrads reduce_grad_partials(const GradPartials& p, const BackwardInputs& b) {
  ParamGrads r;
  if (b.bias.defined()) r.bias = reduce_grad_multiplier(p.bias, b.bias);
  r.multiplier = reduce_grad_multiplier(p.multiplier, b.multiplier);
  return r;
}

}  // namespace post_pool
}  // namespace fused
