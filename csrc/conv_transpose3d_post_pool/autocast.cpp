// torch.autocast for fused::conv_transpose3d_post_pool and its training form: the call behaves as the eager chain
// does inside autocast. aten's conv_transpose3d is on autocast's lower-precision list, so its input, weight and
// bias are cast to the autocast dtype (float16 or bfloat16; the cast cache applies to the weights as it does for
// aten's ops); a multiplier of one dim or more is left as it is, so a float32 one promotes the tail of the chain to
// float32 (the ops' mixed form: output float32, first LeakyReLU rounded to the autocast dtype), as
// `x * multiplier` does eagerly, while a 0-dim one promotes nothing there and takes the autocast dtype. post_pool
// and the backward ops need nothing: eager autocast casts none of leaky_relu, mul, max_pool3d.
//
// A call that records no gradient, with input, weight and bias all of a dtype autocast casts, goes to
// _conv_transpose3d_post_pool_cast instead: the same casts, but the fused kernel can do them as it loads the
// operands, so that compiled graphs and eager calls launch no cast kernels (and read no cast copies).
#include "common/autograd.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace fused {
namespace {

using Outputs = std::tuple<at::Tensor, at::Tensor, at::Tensor>;

template <c10::DeviceType kDevice>
struct Autocast {
  static at::ScalarType dtype() { return at::autocast::get_lower_precision_fp_from_device_type(kDevice); }
  static at::Tensor cast(const at::Tensor& t) { return at::autocast::cached_cast(dtype(), t, kDevice); }
  static std::optional<at::Tensor> cast(const std::optional<at::Tensor>& t) {
    return at::autocast::cached_cast(dtype(), t, kDevice);
  }
  static at::Tensor multiplier_of(const at::Tensor& m) { return m.dim() == 0 ? cast(m) : m; }
  // Whether cached_cast would cast `t` (a floating tensor on this device type, not float64) or leave it as it is
  // because it already holds the autocast dtype: then t.to(dtype()) is the same cast.
  static bool casts_as_to(const at::Tensor& t) {
    return t.device().type() == kDevice && t.is_floating_point() && t.scalar_type() != at::kDouble;
  }
  static bool rounds_in_op(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           const at::Tensor& multiplier) {
    const bool has_bias = bias.has_value() && bias->defined();
    return !needs_grad({&input, &weight, has_bias ? &*bias : nullptr, &multiplier}) && casts_as_to(input) &&
           casts_as_to(weight) && (!has_bias || casts_as_to(*bias));
  }

  static at::Tensor inference(const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,
                              const at::Tensor& multiplier, double negative_slope, at::IntArrayRef kernel_size,
                              at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                              at::IntArrayRef pool_dilation, bool ceil_mode, std::optional<double> negative_slope2) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(
        at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
    if (rounds_in_op(input, weight, bias, multiplier)) {
      static const auto cast_op =
          op_handle<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::ScalarType,
                               at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef,
                               const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, bool, std::optional<double>)>("fused::_conv_transpose3d_post_pool_cast");
      return cast_op.call(input, weight, bias, dtype(), stride, padding, output_padding, groups, dilation,
                          multiplier_of(multiplier), negative_slope, kernel_size, pool_stride, pool_padding,
                          pool_dilation, ceil_mode, negative_slope2);
    }
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("fused::conv_transpose3d_post_pool", "")
                               .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                 const std::optional<at::Tensor>&, at::IntArrayRef, at::IntArrayRef,
                                                 at::IntArrayRef, int64_t, at::IntArrayRef, const at::Tensor&, double,
                                                 at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef,
                                                 bool, std::optional<double>)>();
    return op.call(cast(input), cast(weight), cast(bias), stride, padding, output_padding, groups, dilation,
                   multiplier_of(multiplier), negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation,
                   ceil_mode, negative_slope2);
  }

  static Outputs training(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef output_padding,
                          int64_t groups, at::IntArrayRef dilation, const at::Tensor& multiplier,
                          double negative_slope, at::IntArrayRef kernel_size, at::IntArrayRef pool_stride,
                          at::IntArrayRef pool_padding, at::IntArrayRef pool_dilation, bool ceil_mode,
                          std::optional<double> negative_slope2) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(
        at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("fused::conv_transpose3d_post_pool_with_offsets", "")
                               .typed<Outputs(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                                              at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, int64_t,
                                              at::IntArrayRef, const at::Tensor&, double, at::IntArrayRef,
                                              at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                                              std::optional<double>)>();
    return op.call(cast(input), cast(weight), cast(bias), stride, padding, output_padding, groups, dilation,
                   multiplier_of(multiplier), negative_slope, kernel_size, pool_stride, pool_padding, pool_dilation,
                   ceil_mode, negative_slope2);
  }
};

}  // namespace
}  // namespace fused

TORCH_LIBRARY_IMPL(fused, AutocastCPU, m) {
  using A = fused::Autocast<c10::DeviceType::CPU>;
  m.impl("conv_transpose3d_post_pool", &A::inference);
  m.impl("conv_transpose3d_post_pool_with_offsets", &A::training);
}

TORCH_LIBRARY_IMPL(fused, AutocastCUDA, m) {
  using A = fused::Autocast<c10::DeviceType::CUDA>;
  m.impl("conv_transpose3d_post_pool", &A::inference);
  m.impl("conv_transpose3d_post_pool_with_offsets", &A::training);
}
