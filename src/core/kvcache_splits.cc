#include "core/kvcache_splits.h"

#include <algorithm>

namespace dpa {

int kvcache_num_splits(int64_t blocks, int64_t key_tiles, int64_t slots) {
  if (blocks <= 0 || slots <= 0 || key_tiles < 2 * kKvCacheMinTilesPerSplit) return 1;
  // Most of a wave already: splitting only adds merge work.
  if (10 * blocks >= 8 * slots) return 1;
  const int most = int(std::min<int64_t>(kKvCacheMaxSplits, key_tiles / kKvCacheMinTilesPerSplit));
  auto efficiency = [&](int splits) {
    const int64_t total = blocks * splits;
    const int64_t waves = (total + slots - 1) / slots;
    return double(total) / double(waves * slots);
  };
  double best = 0;
  for (int splits = 1; splits <= most; ++splits) best = std::max(best, efficiency(splits));
  // Within 5% of the best: decode of one sequence is bound by how evenly the blocks load the
  // SMs, and a split costs less in the merge than an idle SM costs in the attention.
  for (int splits = 1; splits <= most; ++splits)
    if (efficiency(splits) >= 0.95 * best) return splits;
  return 1;
}

int64_t kvcache_key_tiles(int64_t capacity, int64_t window_left, int64_t window_right,
                          int64_t queries_per_block) {
  int64_t span = std::max<int64_t>(capacity, 0);
  if (window_left >= 0 && window_right >= 0)
    span = std::min(span, window_left + window_right + std::max<int64_t>(queries_per_block, 1));
  // +1: a span that starts inside a tile ends inside the next one.
  return (span + kKvCacheTileKeys - 1) / kKvCacheTileKeys + 1;
}

bool kvcache_deep_pipeline(int64_t key_tiles, int splits) {
  return splits > 1 && key_tiles <= kKvCacheDeepPipelineTiles * splits;
}

bool kvcache_whole_range_in_flight(int64_t key_tiles, int splits, int deep_stages, int64_t blocks,
                                   int64_t deep_slots) {
  return splits == 1 && key_tiles <= deep_stages && blocks <= deep_slots;
}

bool kvcache_prefill_on_flash(int arch, bool packed_q, int64_t queries_per_sequence,
                              int64_t head_dim) {
  return arch == 90 && !packed_q && queries_per_sequence >= kKvCacheFlashPrefillQueries &&
         (head_dim == 64 || head_dim == 128);
}

}  // namespace dpa
