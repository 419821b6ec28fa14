// Philox4x32-10 known answers (Random123's kat_vectors) and the exact dropout keep mapping of
// DESIGN.md §5.
#include <gtest/gtest.h>

#include "core/philox.h"

namespace dpa {
namespace {

TEST(Philox, KnownAnswerZeroCounterZeroKey) {
  Philox4 out = philox4x32_10(Philox4{{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(out.x[0], 0x6627e8d5u);
  EXPECT_EQ(out.x[1], 0xe169c58du);
  EXPECT_EQ(out.x[2], 0xbc57ac4cu);
  EXPECT_EQ(out.x[3], 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerAllOnes) {
  Philox4 out = philox4x32_10(Philox4{{~0u, ~0u, ~0u, ~0u}}, ~0u, ~0u);
  EXPECT_EQ(out.x[0], 0x408f276du);
  EXPECT_EQ(out.x[1], 0x41c83b0eu);
  EXPECT_EQ(out.x[2], 0xa20bc7c6u);
  EXPECT_EQ(out.x[3], 0x6d5451fdu);
}

// The kernels' form with the round keys precomputed (held in their parameters) is the same
// function.
TEST(Philox, RoundKeysGiveTheSameBlocks) {
  const uint32_t key0 = 0x89abcdefu, key1 = 0x01234567u;
  const PhiloxRoundKeys keys = philox_round_keys(key0, key1);
  for (uint32_t i = 0; i < 64; ++i) {
    const Philox4 counter{{i * 0x9e3779b9u, i, ~i, i << 7}};
    const Philox4 expected = philox4x32_10(counter, key0, key1);
    const Philox4 got = philox4x32_10(counter, keys);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(got.x[w], expected.x[w]) << "counter " << i;
  }
  const Philox4 zero = philox4x32_10(Philox4{{0, 0, 0, 0}}, philox_round_keys(0, 0));
  EXPECT_EQ(zero.x[0], 0x6627e8d5u);  // the known answer above
  // The keys reach every round: a different key's rounds give a different block.
  const Philox4 counter{{1, 2, 3, 4}};
  const Philox4 one_key = philox4x32_10(counter, keys);
  const Philox4 other_key = philox4x32_10(counter, philox_round_keys(key0 + 1, key1));
  EXPECT_NE(one_key.x[0] ^ other_key.x[0], 0u);
  EXPECT_NE(one_key.x[3] ^ other_key.x[3], 0u);
}

TEST(Philox, DropoutThresholdRounding) {
  EXPECT_EQ(dropout_threshold(0.0), 0u);
  EXPECT_EQ(dropout_threshold(0.5), 32768u);
  EXPECT_EQ(dropout_threshold(0.1), 6554u);       // 6553.6 rounds to 6554
  EXPECT_EQ(dropout_threshold(0.99999), 65535u);  // clamped
  EXPECT_DOUBLE_EQ(dropout_keep_prob(32768u), 0.5);
}

// The two-draw form of the keep rule (the backward's producer) against the rule itself, for
// every threshold, each lane's draw at the values around the threshold and its msb and
// elsewhere, the other lane's draw varied too (a wrong carry between the lanes would show).
TEST(Philox, PairKeepRuleMatchesTheRuleForEveryThreshold) {
  int64_t mismatches = 0;
  for (uint32_t t = 0; t <= 0xffffu; ++t) {
    const DropoutPairRule rule = dropout_pair_rule(t);
    const uint32_t draws[] = {0u,      t - 1u,  t,       t + 1u,      0x7fffu,    0x8000u,
                              0x8001u, 0xfffeu, 0xffffu, t ^ 0x8000u, (t * 7919u)};
    for (uint32_t low : draws) {
      for (uint32_t high : draws) {
        low &= 0xffffu;
        high &= 0xffffu;
        const uint32_t msbs = dropout_keep_msbs(low | (high << 16), rule);
        mismatches += ((msbs >> 15) & 1u) != uint32_t(low >= t);
        mismatches += (msbs >> 31) != uint32_t(high >= t);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// The bytes the keep words take: bit 7 of byte i is draw 4 half + i's keep bit.
TEST(Philox, KeepByteMsbsFollowTheDrawOrder) {
  const uint32_t threshold = dropout_threshold(0.3);
  const DropoutPairRule rule = dropout_pair_rule(threshold);
  int kept = 0;
  for (uint32_t i = 0; i < 256; ++i) {
    const Philox4 block = philox4x32_10(Philox4{{i, 3 * i, 7, 11}}, 0x1234u, 0x5678u);
    for (int half = 0; half < 2; ++half) {
      const uint32_t bytes = dropout_keep_byte_msbs(block, half, rule);
      for (int byte = 0; byte < 4; ++byte) {
        const bool expected = dropout_u16(block, 4 * half + byte) >= threshold;
        EXPECT_EQ(((bytes >> (8 * byte + 7)) & 1u) != 0, expected) << i << " " << half << byte;
        kept += expected;
      }
    }
  }
  EXPECT_GT(kept, 1024);  // both outcomes occur (about 70% of 2048 kept)
  EXPECT_LT(kept, 2048);
}

// The counter is (j >> 3, i, h + H * b, lo32(offset)), the key (lo32(seed), hi32(seed)), and
// column 8*(j>>3)+k takes the low half of word k/2 for even k, the high half for odd k.
TEST(Philox, KeepMappingMatchesSpec) {
  const uint64_t seed = 0x123456789abcdefULL, offset = 0x500000007ULL;
  const int64_t heads = 3, batch = 2, head = 1, row = 11;
  const uint32_t threshold = dropout_threshold(0.3);
  for (int64_t col = 0; col < 40; ++col) {
    Philox4 counter{
        {uint32_t(col >> 3), uint32_t(row), uint32_t(head + heads * batch), uint32_t(offset)}};
    Philox4 block = philox4x32_10(counter, 0x89abcdefu, 0x01234567u);
    const int k = int(col & 7);
    const uint32_t word = block.x[k / 2];
    const uint32_t u16 = (k % 2 == 0) ? (word & 0xffffu) : (word >> 16);
    EXPECT_EQ(dropout_keep(seed, offset, batch, heads, head, row, col, threshold), u16 >= threshold)
        << "column " << col;
  }
}

TEST(Philox, KeepRateMatchesProbability) {
  const uint32_t threshold = dropout_threshold(0.3);
  int64_t kept = 0, total = 0;
  for (int64_t row = 0; row < 64; ++row)
    for (int64_t col = 0; col < 512; ++col, ++total)
      kept += dropout_keep(42, 0, 0, 1, 0, row, col, threshold);
  EXPECT_NEAR(double(kept) / double(total), 0.7, 0.01);
}

TEST(Philox, DifferentCoordinatesDrawDifferentMasks) {
  const uint32_t threshold = dropout_threshold(0.5);
  int differences_head = 0, differences_offset = 0;
  for (int64_t col = 0; col < 256; ++col) {
    bool base = dropout_keep(7, 0, 0, 4, 0, 3, col, threshold);
    differences_head += base != dropout_keep(7, 0, 0, 4, 1, 3, col, threshold);
    differences_offset += base != dropout_keep(7, 1, 0, 4, 0, 3, col, threshold);
  }
  EXPECT_GT(differences_head, 64);
  EXPECT_GT(differences_offset, 64);
}

}  // namespace
}  // namespace dpa
