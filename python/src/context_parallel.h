// ContextParallelAttention and the NCCL communicator for the Python package (context_parallel.cc).
#pragma once

#include <nanobind/nanobind.h>

namespace dpa::python {

void bind_context_parallel(nanobind::module_& m);

}  // namespace dpa::python
