// dpa::Error -> the dpa.Error subclasses of the Python package (python/dpa/errors.py).
#pragma once

#include <nanobind/nanobind.h>

namespace dpa::python {

// Adds `_set_error_classes(classes)` (a dict from ErrorCode names to exception classes, set by
// the package at import) and the translator that raises them with `.code` and `.argument`.
void register_errors(nanobind::module_& m);

}  // namespace dpa::python
