// Entry points for the code Inductor generates around our operators (torch_fused_ops/compile/extern_calls.py): the
// generated wrapper calls an operator through torch.ops, which matches its Python arguments against the schema on
// every call (the largest share of a fused call's host time on the GPU machine). Here each operator's argument kinds
// are read from its schema once (_register_compiled_op), and each call (_call_compiled_op) reads the arguments as
// Inductor passes them — exact tensors, ints, int lists, floats, bools, dtypes, None — into a stack and calls the
// operator boxed through the dispatcher, so every dispatch key (autograd, autocast, Python modes) still applies.
// Anything else makes it return None and the caller takes torch.ops' path, which validates and raises.
#include "compiled_calls.h"

#include "common/python_args.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace fused {
namespace {

enum class Kind : uint8_t { kTensor, kOptionalTensor, kInt, kIntList, kFloat, kOptionalFloat, kBool, kScalarType };

struct CompiledOp {
  c10::OperatorHandle op;
  std::vector<Kind> kinds;
  size_t returns;
};

// A deque: the ids handed out stay valid while more operators are registered.
std::deque<CompiledOp>& compiled_ops() {
  static std::deque<CompiledOp> ops;
  return ops;
}

// Ints and lists of ints, SymInt or not: Inductor's code passes Python ints, which torch.ops puts on the stack as
// ints for either.
bool is_int(c10::TypeKind k) { return k == c10::TypeKind::IntType || k == c10::TypeKind::SymIntType; }

bool kind_of(const c10::Argument& a, Kind* out) {
  const c10::TypePtr& t = a.real_type();
  if (t->kind() == c10::TypeKind::TensorType) {
    *out = Kind::kTensor;
  } else if (is_int(t->kind())) {
    *out = Kind::kInt;
  } else if (t->kind() == c10::TypeKind::FloatType) {
    *out = Kind::kFloat;
  } else if (t->kind() == c10::TypeKind::BoolType) {
    *out = Kind::kBool;
  } else if (t->kind() == c10::TypeKind::ScalarTypeType) {
    *out = Kind::kScalarType;
  } else if (t->kind() == c10::TypeKind::ListType &&
             is_int(t->castRaw<c10::ListType>()->getElementType()->kind())) {
    *out = Kind::kIntList;
  } else if (t->kind() == c10::TypeKind::OptionalType) {
    const auto k = t->castRaw<c10::OptionalType>()->getElementType()->kind();
    if (k == c10::TypeKind::TensorType) {
      *out = Kind::kOptionalTensor;
    } else if (k == c10::TypeKind::FloatType) {
      *out = Kind::kOptionalFloat;
    } else {
      return false;
    }
  } else {
    return false;
  }
  return true;
}

// One argument onto the stack; false where it is not of the plain form Inductor writes.
bool push_argument(Kind kind, PyObject* o, torch::jit::Stack& stack) {
  if (o == Py_None && (kind == Kind::kOptionalTensor || kind == Kind::kOptionalFloat)) {
    stack.emplace_back();
    return true;
  }
  switch (kind) {
    case Kind::kOptionalTensor:
    case Kind::kTensor:
      // Exactly torch.Tensor or nn.Parameter: a subclass may override __torch_function__, which torch.ops honours.
      if (!THPVariable_CheckExact(o)) return false;
      stack.emplace_back(THPVariable_Unpack(o));
      return true;
    case Kind::kInt: {
      int64_t x = 0;
      if (!read_int(o, &x)) return false;
      stack.emplace_back(x);
      return true;
    }
    case Kind::kIntList: {
      // An int stands for itself repeated, as the schema's int[N] allows; lists and tuples of ints as they are.
      int64_t x = 0;
      if (read_int(o, &x)) {
        stack.emplace_back(std::vector<int64_t>{x, x, x});
        return true;
      }
      const bool list = PyList_CheckExact(o), tuple = PyTuple_CheckExact(o);
      if (!(list || tuple)) return false;
      const Py_ssize_t n = Py_SIZE(o);
      std::vector<int64_t> v(static_cast<size_t>(n));
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (!read_int(list ? PyList_GET_ITEM(o, i) : PyTuple_GET_ITEM(o, i), &v[static_cast<size_t>(i)])) return false;
      }
      stack.emplace_back(std::move(v));
      return true;
    }
    case Kind::kOptionalFloat:
    case Kind::kFloat: {
      double x = 0;
      if (!read_double(o, &x)) return false;
      stack.emplace_back(x);
      return true;
    }
    case Kind::kBool: {
      bool x = false;
      if (!read_bool(o, &x)) return false;
      stack.emplace_back(x);
      return true;
    }
    case Kind::kScalarType:
      if (!THPDtype_Check(o)) return false;
      stack.emplace_back(static_cast<int64_t>(reinterpret_cast<THPDtype*>(o)->scalar_type));
      return true;
  }
  return false;
}

}  // namespace

// _register_compiled_op(name, overload): the id _call_compiled_op takes for fused::name.overload, or None where an
// argument or return is of a kind it does not read (those calls keep torch.ops' path).
PyObject* register_compiled_op(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !PyUnicode_Check(args[0]) || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_register_compiled_op(name: str, overload: str)");
    return nullptr;
  }
  const std::string name = PyUnicode_AsUTF8(args[0]), overload = PyUnicode_AsUTF8(args[1]);
  const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle.has_value()) Py_RETURN_NONE;
  const c10::FunctionSchema& schema = handle->schema();
  std::vector<Kind> kinds;
  for (const c10::Argument& a : schema.arguments()) {
    Kind k;
    if (a.kwarg_only() || !kind_of(a, &k)) Py_RETURN_NONE;
    kinds.push_back(k);
  }
  for (const c10::Argument& r : schema.returns()) {
    if (r.real_type()->kind() != c10::TypeKind::TensorType) Py_RETURN_NONE;
  }
  if (schema.returns().empty() || schema.is_mutable()) Py_RETURN_NONE;
  auto& ops = compiled_ops();
  ops.push_back(CompiledOp{*handle, std::move(kinds), schema.returns().size()});
  return PyLong_FromSsize_t(static_cast<Py_ssize_t>(ops.size() - 1));
  END_HANDLE_TH_ERRORS
}

// _call_compiled_op(id, *arguments): every argument of the schema, positional; the operator's result, or None
// where an argument is not of the plain form (nothing has run then).
PyObject* call_compiled_op(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  int64_t id = -1;
  const auto& ops = compiled_ops();
  if (nargs < 1 || !read_int(args[0], &id) || id < 0 || static_cast<size_t>(id) >= ops.size()) Py_RETURN_NONE;
  const CompiledOp& entry = ops[static_cast<size_t>(id)];
  if (static_cast<size_t>(nargs - 1) != entry.kinds.size()) Py_RETURN_NONE;
  torch::jit::Stack stack;
  stack.reserve(entry.kinds.size());
  for (size_t i = 0; i < entry.kinds.size(); ++i) {
    if (!push_argument(entry.kinds[i], args[i + 1], stack)) Py_RETURN_NONE;
  }
  {
    pybind11::gil_scoped_release no_gil;  // as torch's own bindings do around a call into the dispatcher
    entry.op.callBoxed(stack);
  }
  if (entry.returns == 1) return THPVariable_Wrap(std::move(stack[0]).toTensor());
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(entry.returns));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < entry.returns; ++i) {
    PyObject* t = THPVariable_Wrap(std::move(stack[i]).toTensor());
    if (t == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), t);
  }
  return out;
  END_HANDLE_TH_ERRORS
}

}  // namespace fused
