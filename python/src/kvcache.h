// KvCacheAttention for the Python package (kvcache.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace dpa::python {

void bind_kvcache(nanobind::module_& m);

}  // namespace dpa::python
