// TensorView: a non-owning view of a strided tensor (pointer, dtype, device, shape, strides).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "dpa/types.h"

namespace dpa {

constexpr int kMaxDims = 5;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  int device_index = 0;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements, not bytes

  bool defined() const { return data != nullptr || ndim > 0; }
  int64_t numel() const;
  int64_t size(int dim) const { return shape.at(dim < 0 ? dim + ndim : dim); }
  int64_t stride(int dim) const { return strides.at(dim < 0 ? dim + ndim : dim); }
  bool is_contiguous() const;
  std::string shape_string() const;  // e.g. "[2, 128, 16, 64]"

  // A contiguous (row-major) view.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::kCPU);
  static TensorView contiguous(void* data, DType dtype, const int64_t* shape, int ndim,
                               Device device = Device::kCPU);
};

}  // namespace dpa
