// The core's errors as Python exceptions, for every compiled module of the package (nanobind's
// and PyTorch's pybind11 alike, hence the plain CPython API): each error becomes the class of the
// same name in fusedattn.errors (pure Python, so it can be caught without the compiled modules),
// and InvalidArgumentError also carries field, value and requirement.
#pragma once
#include <Python.h>

#include "fusedattn/errors.h"

namespace fusedattn::python {

inline void set_attribute(PyObject* object, const char* name, const std::string& text) {
  if (PyObject* value = PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()))) {
    PyObject_SetAttrString(object, name, value);
    Py_DECREF(value);
  }
}

/// Sets the Python error for `error` (or, should fusedattn.errors fail to import, that failure).
inline void set_python_error(const Error& error) {
  static const char* const kClasses[] = {"InvalidArgumentError", "NotSupportedError", "CudnnError", "CudaError",
                                         "SetupError"};
  PyObject* errors = PyImport_ImportModule("fusedattn.errors");
  if (!errors) return;
  PyObject* cls = PyObject_GetAttrString(errors, kClasses[static_cast<int>(error.kind())]);
  Py_DECREF(errors);
  if (!cls) return;
  PyObject* instance = PyObject_CallFunction(cls, "s", error.what());
  if (instance) {
    if (const auto* invalid = dynamic_cast<const InvalidArgument*>(&error)) {
      set_attribute(instance, "field", invalid->field());
      set_attribute(instance, "value", invalid->value());
      set_attribute(instance, "requirement", invalid->requirement());
    }
    PyErr_SetObject(cls, instance);
    Py_DECREF(instance);
  }
  Py_DECREF(cls);
}

}  // namespace fusedattn::python
