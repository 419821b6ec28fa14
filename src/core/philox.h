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

// The keep rule for both u16 draws of a word at once, in four 32-bit operations instead of a
// mask, two compares and two selects (the one-kernel backward's producer tests 64 draws per
// thread and tile, on the ALU pipe its consumers share). Bit 15 of dropout_keep_msbs is whether
// the low half is kept, bit 31 the high half; the other bits are not specified. A lane u is
// kept iff msb(u) > msb(t), or the msbs are equal and low15(u) >= low15(t); the second test is
// bit 15 of low15(u) + 0x8000 - low15(t), which cannot carry into the next lane.
struct DropoutPairRule {
  uint32_t lane_bias;     // 0x8000 - low15(t), in both lanes
  uint32_t msb_suffices;  // all ones where msb(t) = 0: there a set msb alone keeps the draw
};
DPA_HOST_DEVICE DropoutPairRule dropout_pair_rule(uint32_t threshold) {
  const uint32_t bias = 0x8000u - (threshold & 0x7fffu);
  return {bias | (bias << 16), (threshold & 0x8000u) ? 0u : ~0u};
}
DPA_HOST_DEVICE uint32_t dropout_keep_msbs(uint32_t word, const DropoutPairRule& rule) {
  const uint32_t low_at_least = (word & 0x7fff7fffu) + rule.lane_bias;
  return (word & low_at_least) | ((word | low_at_least) & rule.msb_suffices);
}

// Bit 7 of byte i (0..3) of the result: whether draw 4 half + i of the block is kept (the bytes
// the one-kernel backward's keep words take, one permutation for four draws); the other bits
// are not specified.
DPA_HOST_DEVICE uint32_t dropout_keep_byte_msbs(const Philox4& block, int half,
                                                const DropoutPairRule& rule) {
  const uint32_t low = dropout_keep_msbs(block.x[2 * half], rule);
  const uint32_t high = dropout_keep_msbs(block.x[2 * half + 1], rule);
#if defined(__CUDA_ARCH__)
  return __byte_perm(low, high, 0x7531);  // bytes 1 and 3 of each: their bits 15 and 31
#else
  return ((low >> 8) & 0xffu) | ((low >> 16) & 0xff00u) | ((high << 8) & 0xff0000u) |
         (high & 0xff000000u);
#endif
}

DPA_HOST_DEVICE bool dropout_keep(uint64_t seed, uint64_t offset, int64_t batch, int64_t heads,
                                  int64_t head, int64_t row, int64_t col, uint32_t threshold) {
  Philox4 block = dropout_block(seed, offset, batch, heads, head, row, col);
  return dropout_u16(block, int(col & 7)) >= threshold;
}

}  // namespace dpa
