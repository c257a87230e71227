// The Python module `torch_fused_ops._C`: importing it loads this library (which runs every registration), and it
// holds the eager wrappers' entry points. A call through torch.ops parses its arguments against the schema on every
// call (about as long as the whole op on the GPU machine's host, for the convolution's 16 arguments); these read
// the wrapper's own arguments as they come (tensors, plain ints or lists of three, floats, bools, None), expand the
// int-or-three ones as the wrapper does, and call the operator through the dispatcher, so every dispatch key
// (autograd, autocast, Python dispatch modes) still applies. Anything else makes them return None, and the
// wrapper takes its Python path, which validates and raises. The wrappers call them only outside Dynamo's tracing
// and when no argument or mode overrides __torch_function__ (ops/post_pool.py, ops/conv_transpose3d_post_pool.py).
#include "common/python_args.h"
#include "compiled_calls.h"
#include "conv_transpose3d_post_pool/contract.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>

#include <Python.h>

#include <array>
#include <cstdint>
#include <optional>

namespace fused {
namespace {

// Up to three ints: one int3 argument in the schema's form ([] for a pool stride given as None).
struct Int3Arg {
  std::array<int64_t, 3> v{};
  size_t n = 0;
  at::IntArrayRef ref() const { return at::IntArrayRef(v.data(), n); }
};

// An int (expanded to three), a list or tuple of three ints, or None when `none_is_empty`.
bool read_int3(PyObject* o, Int3Arg* out, bool none_is_empty = false) {
  if (o == Py_None) {
    out->n = 0;
    return none_is_empty;
  }
  int64_t x = 0;
  if (read_int(o, &x)) {
    out->v = {x, x, x};
    out->n = 3;
    return true;
  }
  const bool list = PyList_CheckExact(o), tuple = PyTuple_CheckExact(o);
  if (!(list || tuple) || Py_SIZE(o) != 3) return false;
  for (Py_ssize_t i = 0; i < 3; ++i) {
    if (!read_int(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), &out->v[i])) return false;
  }
  out->n = 3;
  return true;
}

bool read_optional_double(PyObject* o, std::optional<double>* out) {
  if (o == Py_None) {
    *out = std::nullopt;
    return true;
  }
  double x = 0;
  if (!read_double(o, &x)) return false;
  *out = x;
  return true;
}

const at::Tensor* read_tensor(PyObject* o) { return THPVariable_Check(o) ? &THPVariable_Unpack(o) : nullptr; }

using ConvSig = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, at::IntArrayRef,
                           at::IntArrayRef, at::IntArrayRef, int64_t, at::IntArrayRef, const at::Tensor&, double,
                           at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, at::IntArrayRef, bool,
                           std::optional<double>);

// conv_transpose3d_post_pool(input, weight, bias, multiplier, negative_slope, stride, padding, output_padding,
// groups, dilation, kernel_size, pool_stride, pool_padding, pool_dilation, ceil_mode, negative_slope2): the
// wrapper's argument order, all 16 positional.
PyObject* conv_transpose3d_post_pool(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 16) Py_RETURN_NONE;
  const at::Tensor* input = read_tensor(args[0]);
  const at::Tensor* weight = read_tensor(args[1]);
  const at::Tensor* multiplier = read_tensor(args[3]);
  const at::Tensor* bias = args[2] == Py_None ? nullptr : read_tensor(args[2]);
  double slope = 0;
  std::optional<double> slope2;
  int64_t groups = 0;
  bool ceil_mode = false;
  Int3Arg stride, padding, output_padding, dilation, kernel_size, pool_stride, pool_padding, pool_dilation;
  if (input == nullptr || weight == nullptr || multiplier == nullptr || (args[2] != Py_None && bias == nullptr) ||
      !read_double(args[4], &slope) || !read_int3(args[5], &stride) || !read_int3(args[6], &padding) ||
      !read_int3(args[7], &output_padding) || !read_int(args[8], &groups) || !read_int3(args[9], &dilation) ||
      !read_int3(args[10], &kernel_size) || !read_int3(args[11], &pool_stride, /*none_is_empty=*/true) ||
      !read_int3(args[12], &pool_padding) || !read_int3(args[13], &pool_dilation) ||
      !read_bool(args[14], &ceil_mode) || !read_optional_double(args[15], &slope2)) {
    Py_RETURN_NONE;
  }
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("fused::conv_transpose3d_post_pool", "").typed<ConvSig>();
  const std::optional<at::Tensor> bias_opt = bias == nullptr ? std::nullopt : std::optional<at::Tensor>(*bias);
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;  // as torch's own bindings do around a call into the dispatcher
    out = op.call(*input, *weight, bias_opt, stride.ref(), padding.ref(), output_padding.ref(), groups,
                  dilation.ref(), *multiplier, slope, kernel_size.ref(), pool_stride.ref(), pool_padding.ref(),
                  pool_dilation.ref(), ceil_mode, slope2);
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

using PostPoolSig = at::Tensor(const at::Tensor&, const at::Tensor&, double, at::IntArrayRef, at::IntArrayRef,
                               at::IntArrayRef, at::IntArrayRef, bool, std::optional<double>);

// post_pool(input, multiplier, negative_slope, kernel_size, stride, padding, dilation, ceil_mode, negative_slope2).
PyObject* post_pool(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 9) Py_RETURN_NONE;
  const at::Tensor* input = read_tensor(args[0]);
  const at::Tensor* multiplier = read_tensor(args[1]);
  double slope = 0;
  std::optional<double> slope2;
  bool ceil_mode = false;
  Int3Arg kernel_size, stride, padding, dilation;
  if (input == nullptr || multiplier == nullptr || !read_double(args[2], &slope) ||
      !read_int3(args[3], &kernel_size) || !read_int3(args[4], &stride, /*none_is_empty=*/true) ||
      !read_int3(args[5], &padding) || !read_int3(args[6], &dilation) || !read_bool(args[7], &ceil_mode) ||
      !read_optional_double(args[8], &slope2)) {
    Py_RETURN_NONE;
  }
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("fused::post_pool", "").typed<PostPoolSig>();
  at::Tensor out;
  {
    pybind11::gil_scoped_release no_gil;
    out = op.call(*input, *multiplier, slope, kernel_size.ref(), stride.ref(), padding.ref(), dilation.ref(),
                  ceil_mode, slope2);
  }
  return THPVariable_Wrap(std::move(out));
  END_HANDLE_TH_ERRORS
}

// The value of a development switch's argument: false (a Python error set) unless it is an int in [0, max]; `value`
// stays -1 for None (only read the switch).
bool switch_value(PyObject* arg, long max, const char* range_error, long& value) {
  value = -1;
  if (arg == Py_None) return true;
  value = PyLong_AsLong(arg);
  if (value == -1 && PyErr_Occurred()) return false;
  if (value < 0 || value > max) {
    PyErr_SetString(PyExc_ValueError, range_error);
    return false;
  }
  return true;
}

// A three-way development switch (an enum class over 0..2) as a Python function: sets it from an int and returns the
// previous value; with None, only returns it; anything else raises and changes nothing.
template <typename E>
PyObject* enum_switch(E& choice, PyObject* arg, const char* range_error) {
  const int previous = static_cast<int>(choice);
  long v;
  if (!switch_value(arg, 2, range_error, v)) return nullptr;
  if (v >= 0) choice = static_cast<E>(v);
  return PyLong_FromLong(previous);
}

// _conv_forward_kernel(choice): the fused convolution's forward kernel switch (contract.h: 0 auto, 1 the mma.sync
// kernel, 2 the sm_90a kernel wherever it can run). For tests and benchmarks.
PyObject* conv_forward_kernel(PyObject* /*self*/, PyObject* arg) {
  return enum_switch(conv_forward_kernel_choice(), arg,
                     "_conv_forward_kernel: 0 (auto), 1 (mma.sync) or 2 (sm_90a wgmma)");
}

// _conv_hopper_split(choice): how the sm_90a kernel hands out work (contract.h: 0 auto, 1 units, 2 halves). For
// benchmarks comparing the two.
PyObject* conv_hopper_split_py(PyObject* /*self*/, PyObject* arg) {
  return enum_switch(conv_hopper_split_choice(), arg, "_conv_hopper_split: 0 (auto), 1 (units) or 2 (halves)");
}

// _conv_hopper_ablation(bits): parts of the sm_90a kernel to leave out (ablation.h, ConvHopperAblation; its outputs
// are then wrong), returning the previous bits; with None, only returns them. For benchmarks measuring where the
// kernel's time goes.
PyObject* conv_hopper_ablation_py(PyObject* /*self*/, PyObject* arg) {
  const uint32_t previous = conv_hopper_ablation();
  long v;
  if (!switch_value(arg, 7, "_conv_hopper_ablation: bits 1 (epilogue), 2 (wgmma), 4 (staging)", v)) return nullptr;
  if (v > 0 && !kHopperAblationBuilt) {
    PyErr_SetString(PyExc_RuntimeError,
                    "_conv_hopper_ablation: this build's kernel has no ablation branches; rebuild with "
                    "TORCH_FUSED_OPS_HOPPER_ABLATION=1 to measure");
    return nullptr;
  }
  if (v >= 0) conv_hopper_ablation() = static_cast<uint32_t>(v);
  return PyLong_FromLong(static_cast<long>(previous));
}

// _conv_hopper_trace(address): the device address of an int64 buffer of kTraceSlots (hopper/trace.cuh) per block the
// sm_90a kernel writes its event clocks into, 0 for none; returns the previous address. Measurement builds only.
PyObject* conv_hopper_trace_py(PyObject* /*self*/, PyObject* arg) {
  const unsigned long long previous = conv_hopper_trace();
  const unsigned long long v = PyLong_AsUnsignedLongLong(arg);
  if (v == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  if (v != 0 && !kHopperAblationBuilt) {
    PyErr_SetString(PyExc_RuntimeError,
                    "_conv_hopper_trace: this build's kernel has no trace points; rebuild with "
                    "TORCH_FUSED_OPS_HOPPER_ABLATION=1 to measure");
    return nullptr;
  }
  conv_hopper_trace() = v;
  return PyLong_FromUnsignedLongLong(previous);
}

PyObject* conv_wgmma_built(PyObject* /*self*/, PyObject* /*unused*/) {
  return PyBool_FromLong(conv_wgmma_kernel_built() ? 1 : 0);
}

PyMethodDef kMethods[] = {
    {"conv_transpose3d_post_pool", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                       &conv_transpose3d_post_pool)),
     METH_FASTCALL, "fused::conv_transpose3d_post_pool from the wrapper's plain arguments, or None"},
    {"post_pool", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&post_pool)), METH_FASTCALL,
     "fused::post_pool from the wrapper's plain arguments, or None"},
    {"_register_compiled_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&register_compiled_op)),
     METH_FASTCALL, "the id _call_compiled_op takes for fused::name.overload, or None where it cannot read its kinds"},
    {"_call_compiled_op", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call_compiled_op)),
     METH_FASTCALL, "an operator registered by _register_compiled_op from its plain positional arguments, or None"},
    {"_conv_forward_kernel", &conv_forward_kernel, METH_O,
     "sets the fused convolution's forward kernel (0 auto, 1 mma.sync, 2 wgmma) and returns the previous choice"},
    {"_conv_hopper_split", &conv_hopper_split_py, METH_O,
     "sets how the sm_90a kernel hands out work (0 auto, 1 units, 2 halves) and returns the previous choice"},
    {"_conv_hopper_ablation", &conv_hopper_ablation_py, METH_O,
     "leaves parts of the sm_90a kernel out (bits: 1 epilogue, 2 wgmma, 4 staging) for measurement; returns the "
     "previous bits"},
    {"_conv_hopper_trace", &conv_hopper_trace_py, METH_O,
     "the device address of an int64 buffer the sm_90a kernel writes its event clocks into (0: none), for "
     "measurement; returns the previous address"},
    {"_conv_wgmma_built", &conv_wgmma_built, METH_NOARGS,
     "whether this build holds the fused convolution's sm_90a (wgmma) kernel"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace
}  // namespace fused

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                   "torch_fused_ops' compiled library; the operators are in torch.ops.fused", -1,
                                   fused::kMethods};
  return PyModule_Create(&module_def);
}
