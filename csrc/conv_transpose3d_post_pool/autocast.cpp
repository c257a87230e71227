// torch.autocast for fused::conv_transpose3d_post_pool and its training form: the call behaves as the eager chain
// does inside autocast. aten's conv_transpose3d is on autocast's lower-precision list, so its input, weight and
// bias are cast to the autocast dtype (float16 or bfloat16; the cast cache applies to the weights as it does for
// aten's ops); a multiplier of one dim or more is left as it is, so a float32 one promotes the tail of the chain to
// float32 (the ops' mixed form: output float32, first LeakyReLU rounded to the autocast dtype), as
// `x * multiplier` does eagerly, while a 0-dim one promotes nothing there and takes the autocast dtype. post_pool
// and the backward ops need nothing: eager autocast casts none of leaky_relu, mul, max_pool3d.
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

  static at::Tensor inference(const at::Tensor& input, const at::Tensor& weight,
                              const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                              at::IntArrayRef output_padding, int64_t groups, at::IntArrayRef dilation,
                              const at::Tensor& multiplier, double negative_slope, at::IntArrayRef kernel_size,
                              at::IntArrayRef pool_stride, at::IntArrayRef pool_padding,
                              at::IntArrayRef pool_dilation, bool ceil_mode, std::optional<double> negative_slope2) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(
        at::autocast::get_autocast_dispatch_key_from_device_type(kDevice));
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
