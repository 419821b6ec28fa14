// Python objects -> dpa::TensorView. Two forms cross the boundary (DESIGN.md §11):
//   - a view tuple (data_ptr, dtype, device, shape, strides): what the torch layer builds from a
//     tensor's own attributes, the cheapest way in (no DLPack capsule per call); device is -1
//     for the host and the CUDA ordinal otherwise, dtype a dpa::DType value, strides in
//     elements;
//   - any DLPack producer (NumPy, CuPy, JAX, PyTorch), imported through nanobind's ndarray.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <vector>

#include "dpa/tensor.h"

namespace dpa::python {

// Keeps the DLPack imports of one call alive until the call returns.
using Keepalive = std::vector<nanobind::ndarray<>>;

// None -> an undefined view. `name` is the API argument name used in errors.
TensorView to_view(nanobind::handle object, const char* name, Keepalive& keepalive);

}  // namespace dpa::python
