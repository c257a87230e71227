// Reading plain Python arguments in the C entry points (python_module.cpp, compiled_calls.cpp): each returns false,
// with no Python error left set, where the object is not of the exact plain form, so the caller can return None
// and leave the call to the Python or torch.ops path, which validates and raises.
#pragma once

#include <Python.h>

#include <cstdint>

namespace fused {

// An exact int that fits int64 (bool, numpy integers, ... are not).
inline bool read_int(PyObject* o, int64_t* out) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

// An exact float, or an exact int as float(int) gives it.
inline bool read_double(PyObject* o, double* out) {
  if (PyFloat_CheckExact(o)) {
    *out = PyFloat_AS_DOUBLE(o);
    return true;
  }
  if (!PyLong_CheckExact(o)) return false;
  const double x = PyLong_AsDouble(o);
  if (x == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  *out = x;
  return true;
}

inline bool read_bool(PyObject* o, bool* out) {
  if (o != Py_True && o != Py_False) return false;
  *out = o == Py_True;
  return true;
}

}  // namespace fused
