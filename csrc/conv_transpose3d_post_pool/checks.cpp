// The one place where fused::conv_transpose3d_post_pool's arguments are validated (CPU and CUDA kernels, and the
// autograd, run it), the output memory format, and the fused kernel's coverage. The pool part reuses post_pool's
// check (check_post_pool_sizes), given the convolution output's size, so both ops report pool problems alike.
#include "conv_transpose3d_post_pool/checks.h"

#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/native/ConvUtils.h>
#include <c10/util/Exception.h>

#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

namespace fused {
namespace {

void check_defined(const char* op, const char* name, const at::Tensor& t) {
  // None reaches a Tensor argument as an undefined tensor.
  TORCH_CHECK_TYPE(t.defined(), op, ": ", name, " must be a Tensor, got None");
}

// aten's rule for a CUDA transposed 3-D convolution in a cuDNN build, decided without select_conv_backend
// (which builds its SymInt parameters and re-checks every argument: microseconds on every call). Every CUDA
// backend aten can pick here (cuDNN, the slow transposed kernel, the empty-input one) gives a contiguous output
// unless cuDNN runs, and cuDNN gives cudnn_conv_suggest_memory_format. So: contiguous when that suggests
// contiguous; channels_last_3d when it suggests channels_last_3d and cuDNN is certain to be selected (the
// conditions of aten's ConvParams::use_cudnn that can hold here). Anything else (an empty input, cuDNN
// disabled, sizes that need 64-bit indexing, bfloat16 without cuDNN v8 support, a large output_padding) returns
// nullopt: aten is asked.
std::optional<at::MemoryFormat> cudnn_output_format(const at::Tensor& input, const at::Tensor& weight,
                                                    const Int3& s, const Int3& o,
                                                    const std::array<int64_t, 5>& conv_size) {
  // An empty input selects aten's empty backend, or makes it raise: asked.
  if (!input.is_cuda() || input.numel() == 0) return std::nullopt;
  const auto& hooks = at::detail::getCUDAHooks();
  if (!hooks.compiledWithCuDNN()) return std::nullopt;
  if (at::native::cudnn_conv_suggest_memory_format(input, weight) != at::MemoryFormat::ChannelsLast3d) {
    return at::MemoryFormat::Contiguous;
  }
  if (!at::globalContext().userEnabledCuDNN()) return std::nullopt;
  constexpr int64_t int_max = std::numeric_limits<int>::max();
  if (input.numel() / input.size(0) > int_max) return std::nullopt;  // aten's needs_64bit_indexing_no_split
  int64_t per_sample_out = 1;
  for (int i = 1; i < 5; ++i) {
    if (conv_size[i] > int_max) return std::nullopt;
    per_sample_out *= conv_size[i];  // at most int_max squared: no overflow
    if (per_sample_out > int_max) return std::nullopt;
  }
  if (input.scalar_type() == at::kBFloat16 &&
      !(hooks.supportsBFloat16ConvolutionWithCuDNNv8() && at::native::cudnnv8_enabled_check_debug())) {
    return std::nullopt;
  }
  for (int i = 0; i < 3; ++i) {
    if (o[i] >= s[i]) return std::nullopt;  // aten's is_output_padding_big
  }
  return at::MemoryFormat::ChannelsLast3d;
}

// The memory format aten's convolution gives its output: the one of the backend it selects for these
// arguments (cuDNN: channels_last_3d when the input or the weight is, except in float64; CPU: the same where
// oneDNN runs, which depends on dtype, sizes and threads; contiguous where the native kernels run). Asking aten
// keeps the op's layout equal to the eager composite's on every device and version; on CUDA its rule is
// applied directly where it is certain (cudnn_output_format).
at::MemoryFormat conv_output_format(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, const Int3& s, const Int3& p,
                                    const Int3& o, const Int3& d, int64_t groups,
                                    const std::array<int64_t, 5>& conv_size) {
  if (const auto fmt = cudnn_output_format(input, weight, s, o, conv_size)) return *fmt;
  const auto sym = [](const Int3& v) { return c10::fromIntArrayRefUnchecked(at::IntArrayRef(v)); };
  const auto backend = at::native::select_conv_backend(input, weight, bias, sym(s), sym(p), sym(d),
                                                       /*transposed=*/true, sym(o), c10::SymInt(groups),
                                                       std::nullopt);
  return at::native::_determine_backend_memory_format(input, weight, backend) == at::MemoryFormat::ChannelsLast3d
             ? at::MemoryFormat::ChannelsLast3d
             : at::MemoryFormat::Contiguous;
}

// Context::allowTF32CuDNN takes the operator (Float32Op::CONV) on newer torch; without it, it raises once the
// conv and RNN precision flags differ. Older torch has only the flag for both.
template <typename M>
struct FirstArg {
  using type = void;
};
template <typename C, typename A>
struct FirstArg<bool (C::*)(A) const> {
  using type = std::decay_t<A>;
};
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <typename Ctx>
bool conv_tf32_flag(const Ctx& ctx) {
  using Arg = typename FirstArg<decltype(&Ctx::allowTF32CuDNN)>::type;
  if constexpr (IsOptional<Arg>::value) {
    return ctx.allowTF32CuDNN(Arg::value_type::CONV);
  } else {
    return ctx.allowTF32CuDNN();
  }
}

}  // namespace

bool conv_allows_tf32() {
  return conv_tf32_flag(at::globalContext());
}

ConvTranspose3dPostPoolGeometry check_conv_transpose3d_post_pool_args(
    const char* op, const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias_opt,
    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding, int64_t groups,
    at::IntArrayRef dilation, const at::Tensor& multiplier, at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
    at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode) {
  // Same order as the fake impl's _conv_geometry / _output_meta (ops/conv_transpose3d_post_pool.py), so a call with
  // several problems reports the same one.
  check_defined(op, "input", input);
  check_defined(op, "weight", weight);
  check_defined(op, "multiplier", multiplier);
  const bool has_bias = bias_opt.has_value() && bias_opt->defined();
  TORCH_CHECK_VALUE(input.dim() == 5, op, ": expected a 5-D input (N, C, D, H, W), got shape ",
                    shape_str(input.sizes()));
  TORCH_CHECK_VALUE(weight.dim() == 5, op, ": expected a 5-D weight (C_in, C_out/groups, kD, kH, kW), got ",
                    shape_str(weight.sizes()));
  TORCH_CHECK_TYPE(at::isFloatingType(input.scalar_type()), op, ": expected a floating-point input, got ",
                   input.scalar_type());
  TORCH_CHECK_VALUE(input.layout() == at::kStrided && weight.layout() == at::kStrided, op,
                    ": sparse inputs and weights are not supported");
  const auto check_like_input = [&](const char* name, const at::Tensor& t) {
    TORCH_CHECK_TYPE(t.scalar_type() == input.scalar_type(), op, ": ", name, " dtype must equal input dtype, got ",
                     name, " ", t.scalar_type(), " and input ", input.scalar_type());
    TORCH_CHECK_VALUE(t.device() == input.device(), op, ": ", name, " must be on the input's device, got ",
                      t.device(), " and ", input.device());
  };
  check_like_input("weight", weight);
  if (has_bias) check_like_input("bias", *bias_opt);

  ConvTranspose3dPostPoolGeometry g;
  g.stride = expand3(op, "stride", stride);
  g.padding = expand3(op, "padding", padding);
  g.output_padding = expand3(op, "output_padding", output_padding);
  g.dilation = expand3(op, "dilation", dilation);
  g.groups = groups;
  TORCH_CHECK_VALUE(groups >= 1, op, ": groups must be positive, got ", groups);
  const int64_t cin = input.size(1);
  TORCH_CHECK_VALUE(weight.size(0) == cin, op, ": weight.shape[0] must equal the input's channels ", cin, ", got ",
                    shape_str(weight.sizes()));
  TORCH_CHECK_VALUE(cin % groups == 0, op, ": input channels ", cin, " not divisible by groups ", groups);
  const int64_t cout = weight.size(1) * groups;
  if (has_bias) {
    TORCH_CHECK_VALUE(bias_opt->dim() == 1 && bias_opt->size(0) == cout, op, ": bias must be 1-D with ", cout,
                      " elements, got ", shape_str(bias_opt->sizes()));
  }
  const Int3 &s = g.stride, &p = g.padding, &o = g.output_padding, &d = g.dilation;
  g.conv_size[0] = input.size(0);
  g.conv_size[1] = cout;
  for (int i = 0; i < 3; ++i) {
    TORCH_CHECK_VALUE(s[i] > 0 && d[i] > 0 && p[i] >= 0 && o[i] >= 0, op,
                      ": stride and dilation must be positive, padding and output_padding non-negative");
    TORCH_CHECK_VALUE(o[i] < std::max(s[i], d[i]), op,
                      ": output_padding must be smaller than stride or dilation, got ", at::IntArrayRef(o), ", ",
                      at::IntArrayRef(s), ", ", at::IntArrayRef(d));
    g.conv_size[2 + i] = (input.size(2 + i) - 1) * s[i] - 2 * p[i] + d[i] * (weight.size(2 + i) - 1) + o[i] + 1;
  }
  TORCH_CHECK_VALUE(g.conv_size[2] > 0 && g.conv_size[3] > 0 && g.conv_size[4] > 0, op,
                    ": convolution output size ", at::IntArrayRef(g.conv_size).slice(2), " is not positive");
  g.format = conv_output_format(input, weight, bias_opt, s, p, o, d, groups, g.conv_size);
  g.pool = post_pool::check_post_pool_sizes(op, g.conv_size, input.scalar_type(), input.device(), multiplier,
                                            kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode,
                                            g.format == at::MemoryFormat::ChannelsLast3d);
  return g;
}

const char* fused_kernel_unsupported_reason(const at::Tensor& input, const at::Tensor& weight,
                                            const ConvTranspose3dPostPoolGeometry& g) {
  const auto dtype = input.scalar_type();
  if (!input.is_cuda()) return "the input is not a CUDA tensor";
  if (!(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf)) {
    return "the input's dtype is not float32, bfloat16 or float16";
  }
  if (g.groups != 1) return "groups is not 1";
  // Cin == 0 makes the convolution output its bias alone; the composite covers that rare case.
  if (input.size(1) == 0) return "the input has no channels";
  if (weight.size(2) != 3 || weight.size(3) != 3 || weight.size(4) != 3) return "the weight's kernel is not 3x3x3";
  constexpr Int3 twos{2, 2, 2}, ones{1, 1, 1};
  if (g.stride != twos) return "stride is not 2";
  if (g.padding != ones) return "padding is not 1";
  if (g.dilation != ones) return "dilation is not 1";
  for (const int64_t o : g.output_padding) {
    if (o != 0 && o != 1) return "output_padding is not 0 or 1";
  }
  const post_pool::PoolGeometry& pg = g.pool;
  if (pg.kd != 2 || pg.kh != 2 || pg.kw != 2) return "kernel_size is not 2";
  if (pg.sd != 2 || pg.sh != 2 || pg.sw != 2) return "pool_stride is not 2";
  if (pg.pd != 0 || pg.ph != 0 || pg.pw != 0) return "pool_padding is not 0";
  if (pg.dd != 1 || pg.dh != 1 || pg.dw != 1) return "pool_dilation is not 1";
  // The kernel writes D - 1 + output_padding pooled planes: the floor-mode size. ceil_mode gives the same size
  // (and the same windows) exactly when the convolution output is even, i.e. output_padding 1.
  const int64_t pooled[3] = {pg.OD, pg.OH, pg.OW};
  for (int i = 0; i < 3; ++i) {
    if (pooled[i] != input.size(2 + i) - 1 + g.output_padding[i]) {
      return "ceil_mode adds a pooled plane the fused kernel does not write";
    }
  }
  return nullptr;
}

}  // namespace fused
