// Schemas of every operator in the `fused` namespace (the Python module that loads this library is
// python_module.cpp).
#include "common/cpu_huge_pages.h"

#include <torch/library.h>

TORCH_LIBRARY(fused, m) {
  // max_pool3d(leaky_relu(leaky_relu(input, s1) * multiplier, s2)) in one pass; s2 defaults to s1.
  m.def(
      "post_pool(Tensor input, Tensor multiplier, float negative_slope, int[3] kernel_size, int[3] stride=[], "
      "int[3] padding=0, int[3] dilation=1, bool ceil_mode=False, float? negative_slope2=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Training forward: post_pool's output plus, per output, the input value and window offset it selected
  // (all at pooled size, so backward needs no full-resolution tensor).
  m.def(
      "post_pool_with_offsets(Tensor input, Tensor multiplier, float negative_slope, int[3] kernel_size, "
      "int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False, float? negative_slope2=None) "
      "-> (Tensor out, Tensor selected, Tensor offsets)",
      {at::Tag::pt2_compliant_tag});
  // Gradients of input and multiplier from what post_pool_with_offsets saved.
  m.def(
      "post_pool_backward(Tensor grad_output, Tensor selected, Tensor offsets, Tensor multiplier, "
      "float negative_slope, float? negative_slope2, SymInt[5] input_size, int[3] kernel_size, int[3] stride, "
      "int[3] padding, int[3] dilation, bool channels_last) -> (Tensor grad_input, Tensor grad_multiplier)",
      {at::Tag::pt2_compliant_tag});
  // post_pool of input + bias (per channel, 1-D of C): lets a convolution's bias ride in the fused op, since
  // Inductor peels conv biases off into a separate full-resolution add on CUDA.
  m.def(
      "post_pool_bias(Tensor input, Tensor bias, Tensor multiplier, float negative_slope, int[3] kernel_size, "
      "int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False, float? negative_slope2=None) "
      "-> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Its training forward: as post_pool_with_offsets (selected holds the raw input, before the bias).
  m.def(
      "post_pool_bias_with_offsets(Tensor input, Tensor bias, Tensor multiplier, float negative_slope, "
      "int[3] kernel_size, int[3] stride=[], int[3] padding=0, int[3] dilation=1, bool ceil_mode=False, "
      "float? negative_slope2=None) -> (Tensor out, Tensor selected, Tensor offsets)",
      {at::Tag::pt2_compliant_tag});
  // Gradients of input, bias and multiplier.
  m.def(
      "post_pool_bias_backward(Tensor grad_output, Tensor selected, Tensor offsets, Tensor bias, Tensor multiplier, "
      "float negative_slope, float? negative_slope2, SymInt[5] input_size, int[3] kernel_size, int[3] stride, "
      "int[3] padding, int[3] dilation, bool channels_last) "
      "-> (Tensor grad_input, Tensor grad_bias, Tensor grad_multiplier)",
      {at::Tag::pt2_compliant_tag});
  // Private: the CUDA backward with launch choices other than the measured defaults (packs per thread of the
  // channels_last kernel, 0 = by dtype; dependent launches; the single-launch per-channel sum), for
  // benchmarks/post_pool/backward_sweep.py and the tests that compare the forms. grad_bias is undefined (None) without
  // a bias.
  m.def(
      "_post_pool_backward_tuned(Tensor grad_output, Tensor selected, Tensor offsets, Tensor? bias, "
      "Tensor multiplier, float negative_slope, float? negative_slope2, SymInt[5] input_size, int[3] kernel_size, "
      "int[3] stride, int[3] padding, int[3] dilation, bool channels_last, int cl_items, bool dependent_launches, "
      "bool single_launch_sum) -> (Tensor grad_input, Tensor grad_bias, Tensor grad_multiplier)");
  // Private: whether the CPU kernels ask for transparent huge pages on their large outputs (default on; see
  // csrc/common/cpu_huge_pages.h). The package's settings module calls it from its environment variable.
  m.def("_set_cpu_huge_pages(bool enabled) -> ()", &fused::set_cpu_huge_pages);
  // post_pool(conv_transpose3d(input, weight, bias, ...), multiplier, ...): the whole KernelBench chain. Kernels
  // and autograd in C++ (csrc/conv_transpose3d_post_pool/): a fused CUDA kernel where it applies, else aten's
  // convolution followed by fused.post_pool. The output takes the memory format aten's convolution gives.
  m.def(
      "conv_transpose3d_post_pool(Tensor input, Tensor weight, Tensor? bias, int[3] stride, int[3] padding, "
      "int[3] output_padding, int groups, int[3] dilation, Tensor multiplier, float negative_slope, "
      "int[3] kernel_size, int[3] pool_stride=[], int[3] pool_padding=0, int[3] pool_dilation=1, "
      "bool ceil_mode=False, float? negative_slope2=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Its training forward: also the selected convolution output (bias included) and window offset per output,
  // all three at pooled size in the output's memory format.
  m.def(
      "conv_transpose3d_post_pool_with_offsets(Tensor input, Tensor weight, Tensor? bias, int[3] stride, "
      "int[3] padding, int[3] output_padding, int groups, int[3] dilation, Tensor multiplier, float negative_slope, "
      "int[3] kernel_size, int[3] pool_stride=[], int[3] pool_padding=0, int[3] pool_dilation=1, "
      "bool ceil_mode=False, float? negative_slope2=None) -> (Tensor out, Tensor selected, Tensor offsets)",
      {at::Tag::pt2_compliant_tag});
  // conv_transpose3d_post_pool(input.to(dtype), weight.to(dtype), bias.to(dtype), ...): what the op's torch.autocast
  // kernel calls where no gradient is recorded, so that autocast's casts of the operands need no kernels of their
  // own. Where the fused CUDA kernel can (contract.h: conv_transpose3d_post_pool_cuda_rounds_operands) it rounds the
  // float32 operands as it loads them; elsewhere the op casts, then calls conv_transpose3d_post_pool. Same result,
  // bit for bit; differentiable (through the casts).
  m.def(
      "_conv_transpose3d_post_pool_cast(Tensor input, Tensor weight, Tensor? bias, ScalarType dtype, int[3] stride, "
      "int[3] padding, int[3] output_padding, int groups, int[3] dilation, Tensor multiplier, float negative_slope, "
      "int[3] kernel_size, int[3] pool_stride=[], int[3] pool_padding=0, int[3] pool_dilation=1, "
      "bool ceil_mode=False, float? negative_slope2=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Internal: the fused convolution's backward at pooled resolution, for its geometry only (convolution kernel 3,
  // stride 2, padding 1, dilation 1, groups 1, output_padding 0 or 1 per dim; pool 2x2x2 with stride 2, uint8
  // offsets). Kernels in csrc/conv_transpose3d_post_pool/backward.cpp (CUDA kernels:
  // csrc/conv_transpose3d_post_pool/backward_contract.h; elsewhere an aten composite). The convolution output's
  // gradient at each window's selected tap (grad_conv: grad_output's sizes, offsets' strides when those are contiguous
  // or channels_last_3d, else contiguous), the bias gradient [C] and the multiplier gradient (its shape, contiguous).
  m.def(
      "_conv_transpose3d_post_pool_grad_conv(Tensor grad_output, Tensor selected, Tensor offsets, "
      "Tensor multiplier, float negative_slope, float? negative_slope2) "
      "-> (Tensor grad_conv, Tensor grad_bias, Tensor grad_multiplier)",
      {at::Tag::pt2_compliant_tag});
  // The weight's gradient from grad_conv: [C_in, C_out, 3, 3, 3], contiguous.
  m.def(
      "_conv_transpose3d_post_pool_grad_weight(Tensor grad_conv, Tensor offsets, Tensor input, "
      "int[3] output_padding) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // The input's gradient from grad_conv: [N, C_in, PD + 1 - output_padding[0], ...], channels_last_3d when
  // grad_conv is channels_last_3d and not contiguous, else contiguous.
  m.def(
      "_conv_transpose3d_post_pool_grad_input(Tensor grad_conv, Tensor offsets, Tensor weight, "
      "int[3] output_padding) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}
