// The warp-specialised forward's dropout keep words (cuda/flash/flash_keep_words.h), checked on
// the host: the drawing jobs the producer runs, read back the way a consumer thread reads its
// bits, keep exactly the elements of DESIGN.md §5's Philox mapping (core/philox.h, which
// cpu_exact uses).
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/philox.h"
#include "cuda/flash/flash_keep_words.h"

namespace dpa::cuda {
namespace {

struct TileCase {
  int block_m, block_n;  // rows (64 per consumer warpgroup) and keys of the tile
  int64_t batch, heads_total, head, row0, key0;
  uint64_t seed, offset;
  double p;
};

// Draws every job of the tile as the producer's drawing threads do (each job once, in any
// order), then checks each consumer thread's two words bit by bit.
std::string first_mismatch(const TileCase& c) {
  const int parts = c.block_n / 64;
  const uint32_t threshold = dropout_threshold(c.p);
  const TileKeepCounter counter = tile_keep_counter(c.seed, c.offset, threshold, c.batch,
                                                    c.heads_total, c.head, c.row0, c.key0);
  const int consumer_threads = c.block_m / 64 * 128;
  // Filled with a pattern no job writes in full, so that a unit no job covers shows up.
  std::vector<uint16_t> units(size_t(consumer_threads) * 4, 0xa5a5);
  for (int drawer = 0; drawer < 96; ++drawer)
    for (int job = drawer; job < c.block_m * parts; job += 96)
      draw_keep_job(counter, job, parts, units.data());
  for (int thread = 0; thread < consumer_threads; ++thread) {
    // The consumer's view: warp w of warpgroup g holds slab 4 g + w, lane = 4 quad_row + q.
    const int slab = thread / 32, lane = thread % 32, quad_row = lane / 4, quad_col = lane % 4;
    for (int half = 0; half < 2; ++half) {
      const uint32_t word = uint32_t(units[size_t(thread) * 4 + 2 * half]) |
                            uint32_t(units[size_t(thread) * 4 + 2 * half + 1]) << 16;
      const int row = slab * 16 + quad_row + 8 * half;
      for (int t = 0; t < c.block_n / 8; ++t)
        for (int e = 0; e < 2; ++e) {
          const int key = 8 * t + 2 * quad_col + e;
          const bool got = (word >> (2 * t + e)) & 1u;
          const bool want = dropout_keep(c.seed, c.offset, c.batch, c.heads_total, c.head,
                                         c.row0 + row, c.key0 + key, threshold);
          if (got != want) {
            std::string at = "thread ";
            at += std::to_string(thread);
            at += " row ";
            at += std::to_string(row);
            at += " key ";
            at += std::to_string(key);
            return at;
          }
        }
    }
  }
  return "";
}

TEST(FlashKeepWords, ConsumersReadThePhiloxMaskOfTheirElements) {
  const TileCase cases[] = {
      // d128: two consumer warpgroups, 128-key tiles.
      {128, 128, 0, 16, 3, 0, 0, 1234, 7, 0.1},
      // d64: three warpgroups; a later batch, a CP-like head offset and positions.
      {192, 128, 3, 64, 41, 8192, 4096, 0xfedcba9876543210ull, 0x100000005ull, 0.25},
      // d256 and 192: 64-key tiles; positions past 2^31 keep only their low 32 bits.
      {128, 64, 1, 8, 7, (int64_t(1) << 32) + 77, 520, 99, 3, 0.5},
      // A high rate drops almost everything, a tiny one almost nothing.
      {128, 128, 2, 4, 1, 333, 64, 5, 11, 0.99},
      {128, 64, 0, 2, 0, 0, 8, 6, 0, 0.001},
  };
  for (const TileCase& c : cases) EXPECT_EQ(first_mismatch(c), "") << c.block_m << "x" << c.block_n;
}

// The check can fail: a word read for the wrong quad column, or a tile drawn one key block off,
// disagrees with the mapping.
TEST(FlashKeepWords, AMisplacedDrawDisagrees) {
  TileCase c{128, 128, 0, 16, 3, 0, 0, 1234, 7, 0.5};
  const std::string right = first_mismatch(c);
  EXPECT_EQ(right, "");
  // The same words checked against keys 8 further on (one Philox block off).
  const uint32_t threshold = dropout_threshold(c.p);
  const TileKeepCounter shifted =
      tile_keep_counter(c.seed, c.offset, threshold, c.batch, c.heads_total, c.head, c.row0, 8);
  std::vector<uint16_t> units(256 * 4, 0);
  for (int job = 0; job < 128 * 2; ++job) draw_keep_job(shifted, job, 2, units.data());
  int differ = 0;
  for (int thread = 0; thread < 256; ++thread) {
    const int lane = thread % 32;
    const uint32_t word =
        uint32_t(units[size_t(thread) * 4]) | uint32_t(units[size_t(thread) * 4 + 1]) << 16;
    const int row = thread / 32 * 16 + lane / 4;
    for (int t = 0; t < 16; ++t)
      differ += ((word >> (2 * t)) & 1u) !=
                unsigned(dropout_keep(c.seed, c.offset, c.batch, c.heads_total, c.head, row,
                                      8 * t + 2 * (lane % 4), threshold));
  }
  EXPECT_GT(differ, 256 * 16 / 4);  // about half of 4096 elements at p = 0.5
}

}  // namespace
}  // namespace dpa::cuda
