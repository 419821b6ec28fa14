// Dropout's keep bits for the warp-specialised forward (flash_forward_sm90_ws.cuh), drawn by
// the producer warpgroup into shared memory so that the consumers' loop holds no Philox draws
// (DESIGN.md §5). Host-includable: tests check the layout against the Philox mapping without a
// GPU.
//
// Layout of one key tile's words: two 32-bit words per consumer thread (its rows quad_row and
// quad_row + 8 of its warp's 16-row slab), bit 2t (+1) of a word for key 8t + 2q (+1) of the
// tile (q: the thread's quad column), as draw_keep_bits leaves them in registers, so a consumer
// reads its bits with one 8-byte load and applies them as before (apply_dropout). A drawing job
// is one row r of the block and one part u of its 8-key Philox blocks (blocks 8u .. 8u + 7, so
// 16 bits of each of the four quad threads' word): it draws eight blocks and writes four 16-bit
// units.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/philox.h"

namespace dpa::cuda {

// Philox blocks per drawing job (one 16-bit unit of a keep word).
constexpr int kKeepBlocksPerJob = 8;

// The counter words every draw of one tile shares (dropout_block's, in 32 bits: it keeps the
// low 32 bits of each).
struct TileKeepCounter {
  uint32_t key_block0;  // (global key of the tile's first column) >> 3
  uint32_t row0;        // global position of the block's first row
  uint32_t head;        // global head + heads_total * batch
  uint32_t offset;      // the call's offset, low 32 bits
  uint32_t seed_low, seed_high;
  uint32_t threshold;  // dropout_threshold: kept iff u16 >= threshold
};

// `key0` (the tile's first global key) is a multiple of 8 (tiles start on whole Philox blocks,
// and CP tiles' keys start on multiples of 8).
DPA_HOST_DEVICE TileKeepCounter tile_keep_counter(uint64_t seed, uint64_t offset,
                                                  uint32_t threshold, int64_t batch,
                                                  int64_t heads_total, int64_t head, int64_t row0,
                                                  int64_t key0) {
  TileKeepCounter c;
  c.key_block0 = uint32_t(key0 >> 3);
  c.row0 = uint32_t(row0);
  c.head = uint32_t(head + heads_total * batch);
  c.offset = uint32_t(offset);
  c.seed_low = uint32_t(seed);
  c.seed_high = uint32_t(seed >> 32);
  c.threshold = threshold;
  return c;
}

// The 16-bit unit (index into the tile's words as uint16) that holds part `part` of the word of
// block row `row`'s quad column `quad_col`: the consumer thread of that row is
// slab * 32 + quad_row * 4 + quad_col (slab = row / 16, quad_row = row % 8), its word
// (row / 8) % 2.
DPA_HOST_DEVICE int keep_word_unit(int row, int quad_col, int part) {
  const int thread = (row / 16) * 32 + (row % 8) * 4 + quad_col, half = (row / 8) % 2;
  return (thread * 2 + half) * 2 + part;
}

// Draws job `job` of a tile with `parts` jobs per row (its keys / 64) into `units`.
DPA_HOST_DEVICE void draw_keep_job(const TileKeepCounter& c, int job, int parts, uint16_t* units) {
  const int row = job / parts, part = job % parts;
  // An odd draw u16 (the word's high half) is kept iff the word is >= threshold << 16.
  const uint32_t high_threshold = c.threshold << 16;
  // Per quad column, two bits per block. The blocks run from the last down, each shifting the
  // bits up by two first, so that every pair lands at bits 0-1 (no variable shift).
  uint32_t bits[4] = {0u, 0u, 0u, 0u};
#if defined(__CUDA_ARCH__)
#pragma unroll 1
#endif
  for (int t = kKeepBlocksPerJob - 1; t >= 0; --t) {
    const Philox4 block = philox4x32_10({{c.key_block0 + uint32_t(kKeepBlocksPerJob * part + t),
                                          c.row0 + uint32_t(row), c.head, c.offset}},
                                        c.seed_low, c.seed_high);
    for (int q = 0; q < 4; ++q) {
      const uint32_t word = block.x[q];
      bits[q] = (bits[q] << 2) | ((word & 0xffffu) >= c.threshold ? 1u : 0u) |
                (word >= high_threshold ? 2u : 0u);
    }
  }
  for (int q = 0; q < 4; ++q) units[keep_word_unit(row, q, part)] = uint16_t(bits[q]);
}

}  // namespace dpa::cuda
