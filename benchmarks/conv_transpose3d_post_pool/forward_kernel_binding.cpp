// Development binding of the fused transposed-convolution kernel alone
// (benchmarks/conv_transpose3d_post_pool/forward_kernel.py): allocates the outputs like the operator does and calls the
// launcher, so the kernel can be built, checked and timed without the rest of the extension.
#include "conv_transpose3d_post_pool/contract.h"

#include <torch/extension.h>

#include <optional>
#include <vector>

namespace fused {
namespace conv_transpose3d_post_pool {
int& mt_override();
}  // namespace conv_transpose3d_post_pool
}  // namespace fused

namespace {

std::vector<at::Tensor> run(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                            const at::Tensor& multiplier, double s1, double s2, std::vector<int64_t> output_padding,
                            bool allow_tf32, bool train, bool channels_last_out, int64_t mt) {
  TORCH_CHECK(output_padding.size() == 3, "output_padding: 3 values");
  const int64_t N = input.size(0), Cout = weight.size(1);
  std::vector<int64_t> shape = {N, Cout, input.size(2) - 1 + output_padding[0], input.size(3) - 1 + output_padding[1],
                                input.size(4) - 1 + output_padding[2]};
  const auto fmt = channels_last_out ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  auto out = at::full(shape, NAN, input.options()).contiguous(fmt);
  at::Tensor sel, off;
  if (train) {
    sel = at::full(shape, NAN, input.options()).contiguous(fmt);
    off = at::full(shape, 255, input.options().dtype(at::kByte)).contiguous(fmt);
  }
  fused::conv_transpose3d_post_pool::mt_override() = static_cast<int>(mt);
  fused::launch_conv_transpose3d_post_pool_cuda(input, weight, bias.has_value() ? *bias : at::Tensor(),
                                                multiplier.reshape(-1), s1, s2,
                                                {output_padding[0], output_padding[1], output_padding[2]},
                                                allow_tf32, out, sel, off);
  fused::conv_transpose3d_post_pool::mt_override() = 0;
  if (train) return {out, sel, off};
  return {out};
}

// Into preallocated outputs (timing: no allocation or poisoning in the measured region).
void run_into(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
              const at::Tensor& multiplier, double s1, double s2, std::vector<int64_t> output_padding, bool allow_tf32,
              const at::Tensor& out, const std::optional<at::Tensor>& sel, const std::optional<at::Tensor>& off,
              int64_t mt) {
  fused::conv_transpose3d_post_pool::mt_override() = static_cast<int>(mt);
  fused::launch_conv_transpose3d_post_pool_cuda(input, weight, bias.has_value() ? *bias : at::Tensor(), multiplier,
                                                s1, s2, {output_padding[0], output_padding[1], output_padding[2]},
                                                allow_tf32, out, sel.has_value() ? *sel : at::Tensor(),
                                                off.has_value() ? *off : at::Tensor());
  fused::conv_transpose3d_post_pool::mt_override() = 0;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "fused conv_transpose3d + post_pool kernel into fresh NaN-poisoned outputs");
  m.def("run_into", &run_into, "the same into preallocated outputs");
}
