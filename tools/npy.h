// NumPy .npy files: reading (format versions 1.0, 2.0 and 3.0) and writing (version 1.0).
//
// Only what attention inputs and outputs need: little-endian float16 / float32 / float64 /
// int32, and bool or uint8 masks, stored in C order. Anything else (big-endian data, other
// dtypes, Fortran order, structured dtypes) is refused with a dpa::Error of code kIo that
// names the file. NumPy has no bfloat16, so bfloat16 arrays can be neither read nor written.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dpa/tensor.h"

namespace dpa::npy {

// An owning, contiguous (C order) host array.
struct Array {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;        // () for a scalar
  std::vector<unsigned char> bytes;  // numel * dtype_size(dtype), C order, little-endian

  Array() = default;
  // A zero-filled array.
  Array(DType dtype, std::vector<int64_t> shape);

  int64_t numel() const;
  int ndim() const { return int(shape.size()); }
  std::string shape_string() const;  // e.g. "[2, 128, 16, 64]"

  // A contiguous host view (at most kMaxDims dims; more throws kIo). The data pointer is never
  // null, even for an empty array, so the view counts as defined.
  TensorView view();
  TensorView view() const;  // same, for reading (the pointer is not const; do not write)

  // A contiguous copy of a host view.
  static Array from_view(const TensorView& view);
};

// Parses a whole .npy file held in memory. `name` (usually the path) appears in errors.
Array decode(std::string_view file_bytes, const std::string& name);
// The .npy (version 1.0) encoding of `array`.
std::string encode(const Array& array);

// Reads a file; every error (missing file, bad header, unsupported dtype) is a dpa::Error with
// code kIo whose argument is `argument` (e.g. the CLI flag that named the file) and whose
// message names the path.
Array load(const std::string& path, const std::string& argument = "");
// Writes `array` to `path` (version 1.0). Throws kIo naming the path on failure.
void save(const std::string& path, const Array& array);
// Writes already-encoded bytes (see encode); lets callers encode everything before writing.
void write_file(const std::string& path, std::string_view bytes);

// The .npy descr string of a dtype ("<f4", "|b1", ...); throws kIo for bfloat16.
std::string descr(DType dtype);

}  // namespace dpa::npy
