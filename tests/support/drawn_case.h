// Test support: attention calls drawn at random (a seeded generator), for the suites that check
// a backend or an algorithm on combinations no named case spells out (cpu: test_cpu_tiled.cc,
// CP: test_cp_attention.cc, cuda_flash: gpu/test_gpu_randomized.cc). The layout (bshd with or
// without per-sequence lengths, sbhd, thd with padded offsets, cross attention), the heads and
// head dims and every feature (both diagonals, windows, softcap, sinks, ALiBi, biases, arbitrary
// masks, dropout, deterministic mode) are drawn independently within a suite's ranges.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "support/attention_case.h"

namespace dpa::test {

struct DrawRanges {
  std::vector<DType> dtypes = {DType::kFloat64};
  std::vector<std::pair<int64_t, int64_t>> head_dims = {{8, 8}, {16, 16}, {16, 8}};
  // Query heads: 0 draws them (H / G of 1, 2 or 4 over G of 1 or 2); otherwise this many, over
  // G of 1, 2 or 4 (CP's all-to-all needs H to divide by its group).
  int64_t heads_q = 0;
  // Every sequence's rows, and a window's left reach, are at least min_rows, so that rows see
  // several keys and no gradient is zero by cancellation (a relative norm of a zero reference
  // reads as infinite).
  int64_t min_rows = 4;
  int64_t max_rows = 130;    // bshd / sbhd query rows; keys up to max_rows + 20
  int64_t row_multiple = 1;  // bshd / sbhd rows are multiples of it (CP: 2 cp)
  int64_t max_thd_rows = 90;
  bool thd_gaps = true;   // padded offsets between thd sequences (CP pads them itself)
  bool thd_cross = true;  // thd keys of their own lengths (CP's thd: the queries' lengths)
  bool biases = true;     // pre- and post-scale biases, broadcast any way
  bool arbitrary_masks = true;
  bool deterministic = false;  // sometimes ask for deterministic mode
};

struct DrawnCase {
  CaseSpec spec;
  std::string what;  // the draw, for failure messages
};

// Draw `index` (also its tensors' seed).
DrawnCase draw_case(std::mt19937& rng, const DrawRanges& ranges, int index);

}  // namespace dpa::test
