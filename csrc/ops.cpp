// Schemas of every operator in the `fused` namespace, and the Python module stub that lets
// `import torch_fused_ops._C` load this library (which runs the registrations below).
#include <Python.h>
#include <torch/library.h>

extern "C" {
// A module with no methods: importing it is only a way to dlopen the library from Python.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

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
  // post_pool(conv_transpose3d(input, weight, bias, ...), multiplier, ...): the whole KernelBench chain. Kernels
  // and autograd in C++ (csrc/conv_transpose3d_post_pool*.cpp): a fused CUDA kernel where it applies, else aten's
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
}
