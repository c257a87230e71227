// The entry points of Inductor's generated code into our operators (compiled_calls.cpp); listed in the Python
// module's method table (python_module.cpp).
#pragma once

#include <Python.h>

namespace fused {

PyObject* register_compiled_op(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* call_compiled_op(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

}  // namespace fused
