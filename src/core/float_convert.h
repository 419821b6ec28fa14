// Scalar conversions between fp32 and the 16-bit storage types, on the host.
// Round-to-nearest-even, as the GPU's cvt.rn does, so CPU and GPU storage agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>

namespace dpa {

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t((bits + rounding) >> 16);
}

inline float half_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    float value = float(mantissa) * 5.9604644775390625e-8f;
    return sign ? -value : value;
  }
  return bits_to_float(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

inline uint16_t float_to_half(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return uint16_t(sign | 0x7e00u);   // NaN
  if (abs_bits >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero) in fp16: quantise to multiples of 2^-24 with RNE.
    float magnitude = bits_to_float(abs_bits);
    float scaled = magnitude * 16777216.0f;  // exact: power of two
    uint32_t q = uint32_t(scaled);
    float remainder = scaled - float(q);
    if (remainder > 0.5f || (remainder == 0.5f && (q & 1u))) ++q;
    return uint16_t(sign | q);
  }
  uint32_t exponent = (abs_bits >> 23) - 112;
  uint32_t mantissa = abs_bits & 0x7fffffu;
  uint32_t result = (exponent << 10) | (mantissa >> 13);
  uint32_t round_bits = mantissa & 0x1fffu;
  if (round_bits > 0x1000u || (round_bits == 0x1000u && (result & 1u))) ++result;
  return uint16_t(sign | result);
}

}  // namespace dpa
