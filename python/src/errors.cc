#include "errors.h"

#include <nanobind/stl/string.h>

#include <string>

#include "dpa/error.h"

namespace nb = nanobind;

namespace dpa::python {
namespace {

// The package's exception classes by code name; RuntimeError until the package sets them.
// A leaked reference: translators may run during interpreter shutdown.
nb::dict& error_classes() {
  static nb::dict* classes = new nb::dict();
  return *classes;
}

void raise(const Error& error) {
  nb::dict& classes = error_classes();
  const char* code = to_string(error.code());
  PyObject* type = classes.contains(code) ? classes[code].ptr() : PyExc_RuntimeError;
  nb::object instance = nb::steal(PyObject_CallOneArg(type, nb::str(error.what()).ptr()));
  if (!instance.is_valid()) return;  // the constructor raised; that exception stands
  nb::setattr(instance, "code", nb::str(code));
  nb::setattr(instance, "argument", nb::str(error.argument().c_str()));
  PyErr_SetObject(type, instance.ptr());
}

}  // namespace

void register_errors(nb::module_& m) {
  m.def("_set_error_classes", [](nb::dict classes) {
    error_classes().clear();
    for (auto [key, value] : classes) error_classes()[key] = value;
  });
  m.def("_error_code_names", []() {
    nb::list names;
    for (ErrorCode code : {ErrorCode::kInvalidArgument, ErrorCode::kNotSupported,
                           ErrorCode::kBackendFailure, ErrorCode::kInternal, ErrorCode::kIo})
      names.append(nb::str(to_string(code)));
    return names;
  });
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& error) {
      raise(error);
    }
  });
}

}  // namespace dpa::python
