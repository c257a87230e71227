// Development binding of the fused convolution's input-gradient kernel alone
// (benchmarks/conv_transpose3d_post_pool/grad_input_kernel.py): allocates grad_input like the operator does (poisoned
// with NaN, so unwritten elements show) and calls the launcher, so the kernel can be built, checked and timed without
// the rest of the extension.
#include "conv_transpose3d_post_pool/backward_contract.h"

#include <torch/extension.h>

#include <vector>

namespace {

at::Tensor run(const at::Tensor& grad_conv, const at::Tensor& offsets, const at::Tensor& weight,
               std::vector<int64_t> input_size, std::vector<int64_t> output_padding, bool allow_tf32,
               bool channels_last_out) {
  TORCH_CHECK(output_padding.size() == 3 && input_size.size() == 3, "3 values each");
  std::vector<int64_t> shape = {grad_conv.size(0), weight.size(0), input_size[0], input_size[1], input_size[2]};
  const auto fmt = channels_last_out ? at::MemoryFormat::ChannelsLast3d : at::MemoryFormat::Contiguous;
  auto gi = at::full(shape, NAN, grad_conv.options()).contiguous(fmt);
  fused::launch_conv_transpose3d_post_pool_grad_input_cuda(grad_conv, offsets, weight,
                                               {output_padding[0], output_padding[1], output_padding[2]},
                                               allow_tf32, gi);
  return gi;
}

// Into a preallocated grad_input (timing: no allocation or poisoning in the measured region).
void run_into(const at::Tensor& grad_conv, const at::Tensor& offsets, const at::Tensor& weight,
              std::vector<int64_t> output_padding, bool allow_tf32, const at::Tensor& grad_input) {
  fused::launch_conv_transpose3d_post_pool_grad_input_cuda(grad_conv, offsets, weight,
                                               {output_padding[0], output_padding[1], output_padding[2]},
                                               allow_tf32, grad_input);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run", &run, "grad_input of the fused convolution into a fresh NaN-poisoned tensor");
  m.def("run_into", &run_into, "the same into a preallocated tensor");
}
