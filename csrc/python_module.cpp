// The Python module `torch_fused_ops._C`: importing it loads this library (which runs every registration), and it
// holds typed entry points for the eager wrappers. An eager call through torch.ops parses its arguments against
// the schema in Python-facing C++ on every call (several microseconds for the convolution op's 16 arguments);
// these take them through pybind11's typed casters and call the same operator through the dispatcher, so every
// dispatch key (autograd, autocast, Python modes) still applies. The wrappers use them only outside Dynamo
// tracing and when no argument or mode overrides __torch_function__ (ops/post_pool.py, ops/conv_transpose3d_post_pool.py).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/python.h>

#include <optional>
#include <vector>

namespace fused {
namespace {

using ConvSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                           at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef, const at::Tensor&, double,
                           at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                           std::optional<double>);

at::Tensor conv_transpose3d_post_pool(const at::Tensor& input, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, const std::vector<int64_t>& stride,
                                      const std::vector<int64_t>& padding, const std::vector<int64_t>& output_padding,
                                      int64_t groups, const std::vector<int64_t>& dilation, const at::Tensor& multiplier,
                                      double negative_slope, const std::vector<int64_t>& kernel_size,
                                      const std::vector<int64_t>& pool_stride, const std::vector<int64_t>& pool_padding,
                                      const std::vector<int64_t>& pool_dilation, bool ceil_mode,
                                      std::optional<double> negative_slope2) {
  // Errors become the Python exceptions torch.ops would raise (ValueError, TypeError, ...), warnings Python warnings.
  HANDLE_TH_ERRORS
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused::conv_transpose3d_post_pool", "").typed<ConvSig>();
  return op.call(input, weight, bias, stride, padding, output_padding, groups, dilation, multiplier, negative_slope,
                 kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode, negative_slope2);
  END_HANDLE_TH_ERRORS_PYBIND
}

using PostPoolSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);

at::Tensor post_pool(const at::Tensor& input, const at::Tensor& multiplier, double negative_slope,
                     const std::vector<int64_t>& kernel_size, const std::vector<int64_t>& stride,
                     const std::vector<int64_t>& padding, const std::vector<int64_t>& dilation, bool ceil_mode,
                     std::optional<double> negative_slope2) {
  HANDLE_TH_ERRORS
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused::post_pool", "").typed<PostPoolSig>();
  return op.call(input, multiplier, negative_slope, kernel_size, stride, padding, dilation, ceil_mode,
                 negative_slope2);
  END_HANDLE_TH_ERRORS_PYBIND
}

}  // namespace
}  // namespace fused

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_fused_ops' compiled library; the operators are in torch.ops.fused";
  m.def("conv_transpose3d_post_pool", &fused::conv_transpose3d_post_pool,
        "fused::conv_transpose3d_post_pool with typed arguments (no schema parsing)");
  m.def("post_pool", &fused::post_pool, "fused::post_pool with typed arguments (no schema parsing)");
}
