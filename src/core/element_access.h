// Reading and writing single elements of any storage dtype on the host.
#pragma once

#include <cstdint>

#include "core/float_convert.h"
#include "dpa/tensor.h"

namespace dpa {

inline double load_element(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kFloat16:
      return half_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kFloat32:
      return static_cast<const float*>(base)[offset];
    case DType::kFloat64:
      return static_cast<const double*>(base)[offset];
    case DType::kInt32:
      return static_cast<const int32_t*>(base)[offset];
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[offset] ? 1.0 : 0.0;
  }
  return 0.0;
}

inline void store_element(void* base, DType dtype, int64_t offset, double value) {
  switch (dtype) {
    case DType::kFloat16:
      static_cast<uint16_t*>(base)[offset] = float_to_half(float(value));
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(base)[offset] = float_to_bf16(float(value));
      break;
    case DType::kFloat32:
      static_cast<float*>(base)[offset] = float(value);
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[offset] = value;
      break;
    case DType::kInt32:
      static_cast<int32_t*>(base)[offset] = int32_t(value);
      break;
    case DType::kBool:
      static_cast<uint8_t*>(base)[offset] = value != 0.0;
      break;
  }
}

inline double load(const TensorView& t, int64_t offset) {
  return load_element(t.data, t.dtype, offset);
}
inline void store(const TensorView& t, int64_t offset, double value) {
  store_element(t.data, t.dtype, offset, value);
}

// Converts `count` contiguous elements to fp32 / from fp32 (the tiled CPU backend's gathers).
void load_row_f32(const void* base, DType dtype, int64_t offset, int64_t count, float* out);
void store_row_f32(void* base, DType dtype, int64_t offset, int64_t count, const float* in);

}  // namespace dpa
