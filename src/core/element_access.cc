#include "core/element_access.h"

namespace dpa {

void load_row_f32(const void* base, DType dtype, int64_t offset, int64_t count, float* out) {
  switch (dtype) {
    case DType::kFloat32: {
      const float* source = static_cast<const float*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) out[i] = source[i];
      return;
    }
    case DType::kFloat16: {
      const uint16_t* source = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) out[i] = half_to_float(source[i]);
      return;
    }
    case DType::kBFloat16: {
      const uint16_t* source = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) out[i] = bf16_to_float(source[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < count; ++i) out[i] = float(load_element(base, dtype, offset + i));
  }
}

void store_row_f32(void* base, DType dtype, int64_t offset, int64_t count, const float* in) {
  switch (dtype) {
    case DType::kFloat32: {
      float* target = static_cast<float*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) target[i] = in[i];
      return;
    }
    case DType::kFloat16: {
      uint16_t* target = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) target[i] = float_to_half(in[i]);
      return;
    }
    case DType::kBFloat16: {
      uint16_t* target = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) target[i] = float_to_bf16(in[i]);
      return;
    }
    default:
      for (int64_t i = 0; i < count; ++i) store_element(base, dtype, offset + i, in[i]);
  }
}

}  // namespace dpa
