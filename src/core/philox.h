// Philox4x32-10 (Random123, as in cuRAND) and the dropout keep rule of DESIGN.md section 5.
// Header-only and constexpr-friendly so that CPU and CUDA code share one definition.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace dpa {

struct Philox4 {
  uint32_t x[4];
};

// Round constants from Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11).
constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;

// The 64-bit product of two words as (lo, hi). On the GPU one mul.wide: written as a 64-bit
// product, nvcc adds a zero to every high word after it (an instruction per product).
struct PhiloxProduct {
  uint32_t lo, hi;
};
DPA_HOST_DEVICE PhiloxProduct philox_multiply(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t lo, hi;
  asm("{\n\t.reg .b64 product;\n\tmul.wide.u32 product, %2, %3;\n\tmov.b64 {%0, %1}, product;\n\t}"
      : "=r"(lo), "=r"(hi)
      : "r"(a), "r"(b));
  return {lo, hi};
#else
  const uint64_t product = uint64_t(a) * b;
  return {uint32_t(product), uint32_t(product >> 32)};
#endif
}

// One Philox round under the round's two key words.
DPA_HOST_DEVICE Philox4 philox_round(const Philox4& counter, uint32_t key0, uint32_t key1) {
  const PhiloxProduct product0 = philox_multiply(kPhiloxMultiplier0, counter.x[0]);
  const PhiloxProduct product1 = philox_multiply(kPhiloxMultiplier1, counter.x[2]);
  return Philox4{{product1.hi ^ counter.x[1] ^ key0, product1.lo, product0.hi ^ counter.x[3] ^ key1,
                  product0.lo}};
}

DPA_HOST_DEVICE Philox4 philox4x32_10(Philox4 counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < 10; ++round) {
    counter = philox_round(counter, key0, key1);
    key0 += kPhiloxWeyl0;
    key1 += kPhiloxWeyl1;
  }
  return counter;
}

// The ten rounds' keys of a key (key0, key1): round r's are key0 + r W0 and key1 + r W1. A
// kernel whose parameters hold them (FlashForwardParams::dropout_round_keys) reads each as a
// constant operand, so its Philox loop needs no register and no add for them.
struct PhiloxRoundKeys {
  uint32_t key0[10], key1[10];
};
DPA_HOST_DEVICE PhiloxRoundKeys philox_round_keys(uint32_t key0, uint32_t key1) {
  PhiloxRoundKeys keys{};
  for (int round = 0; round < 10; ++round) {
    keys.key0[round] = key0 + uint32_t(round) * kPhiloxWeyl0;
    keys.key1[round] = key1 + uint32_t(round) * kPhiloxWeyl1;
  }
  return keys;
}
DPA_HOST_DEVICE Philox4 philox4x32_10(Philox4 counter, const PhiloxRoundKeys& keys) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < 10; ++round)
    counter = philox_round(counter, keys.key0[round], keys.key1[round]);
  return counter;
}

// Dropout threshold t = min(65535, round(p * 65536)); an element is kept iff its u16 >= t.
DPA_HOST_DEVICE uint32_t dropout_threshold(double p) {
  double scaled = p * 65536.0 + 0.5;  // p in [0, 1): round half up, no negatives
  uint32_t t = uint32_t(scaled);
  return t > 65535u ? 65535u : t;
}

DPA_HOST_DEVICE double dropout_keep_prob(uint32_t threshold) {
  return 1.0 - double(threshold) / 65536.0;
}

// The eight 16-bit draws for key columns 8*(j>>3) .. 8*(j>>3)+7 of (batch, head, row).
DPA_HOST_DEVICE Philox4 dropout_block(uint64_t seed, uint64_t offset, int64_t batch, int64_t heads,
                                      int64_t head, int64_t row, int64_t col) {
  Philox4 counter{
      {uint32_t(col >> 3), uint32_t(row), uint32_t(head + heads * batch), uint32_t(offset)}};
  return philox4x32_10(counter, uint32_t(seed), uint32_t(seed >> 32));
}

// Element k (0..7) of a block: low half of word k/2 for even k, high half for odd k.
DPA_HOST_DEVICE uint32_t dropout_u16(const Philox4& block, int k) {
  uint32_t word = block.x[k >> 1];
  return (k & 1) ? (word >> 16) : (word & 0xffffu);
}

DPA_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int64_t batch, int64_t heads,
                                  int64_t head, int64_t row, int64_t col, uint32_t threshold) {
  Philox4 block = dropout_block(seed, offset, batch, heads, head, row, col);
  return dropout_u16(block, int(col & 7)) >= threshold;
}

}  // namespace dpa
