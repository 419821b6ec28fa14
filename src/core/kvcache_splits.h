// The shape of the device KV-cache kernel that the host decides (docs/kvcache.md): its head
// dims, its key tiles, the split-KV heuristic (into how many splits each block of packed rows
// cuts its keys), and which calls run on cuda_flash's forward instead. Host-only, so the CPU CI
// tests it.
#pragma once

#include <cstdint>

namespace dpa {

// Keys per tile of the KV-cache kernel, and the fewest tiles a split is given.
constexpr int64_t kKvCacheTileKeys = 64;
constexpr int64_t kKvCacheMinTilesPerSplit = 2;
constexpr int kKvCacheMaxSplits = 128;
// A split launch whose splits have at most this many tiles each takes the deeper pipeline
// (kvcache_deep_pipeline): b = 1 at 32k keys has 11-16 per split, b = 16 has 171.
constexpr int64_t kKvCacheDeepPipelineTiles = 64;

// The head dims (qk = v) the kernel is built for.
inline bool kvcache_device_head_dim(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

// `blocks`: the kernel's blocks before splitting (sequences x KV heads x row blocks);
// `key_tiles`: the most key tiles one block can visit; `slots`: blocks resident at once on the
// device (SMs x blocks per SM). Returns 1 when the blocks already fill the device; otherwise
// the fewest splits whose waves are at least 95% as full as the best count's, with at least
// kKvCacheMinTilesPerSplit tiles per split.
int kvcache_num_splits(int64_t blocks, int64_t key_tiles, int64_t slots);

// The most key tiles one block of the kernel visits: the cache's capacity, or, with a finite
// window on both sides (causal counts as right = 0), the window's reach from the block's
// queries.
int64_t kvcache_key_tiles(int64_t capacity, int64_t window_left, int64_t window_right,
                          int64_t queries_per_block);

// Whether a launch of `splits` splits over `key_tiles` tiles takes the kernel's deeper pipeline:
// a block of few tiles pays the latency of its first ones on a larger share of its time, and the
// deeper pipeline (fewer blocks per SM) measured faster there and slower where each split still
// has hundreds of tiles (docs/perf.md, session 12).
bool kvcache_deep_pipeline(int64_t key_tiles, int splits);

// Whether an unsplit launch takes the deeper pipeline of `deep_stages` so that each block has
// all of its at most `key_tiles` tiles in flight at once (a windowed decode step: a 128-key
// window spans three 64-key tiles, which two stages load one after another, each issued only
// once the one before it has landed): only where its `blocks` fit on the device at once at the
// deeper pipeline (`deep_slots`), so that the fewer blocks per SM cost no extra wave.
bool kvcache_whole_range_in_flight(int64_t key_tiles, int splits, int deep_stages, int64_t blocks,
                                   int64_t deep_slots);

// Queries per sequence from which a prefill call runs on cuda_flash's warp-specialised forward
// (128-row blocks, one query head each) rather than on the KV-cache kernel, whose 16-row blocks
// read every key again for each 16 packed rows.
constexpr int64_t kKvCacheFlashPrefillQueries = 64;

// Whether a call runs on cuda_flash's forward (its producer reads the cache's pages): on sm_90
// (`arch` 90), head dims 64 and 128, and a q of [b, sq, H, d] with sq of at least
// kKvCacheFlashPrefillQueries. A packed q stays on the KV-cache kernel: its sequences' query
// counts are on the device, and a decode row among them would cost a whole 128-row block.
bool kvcache_prefill_on_flash(int arch, bool packed_q, int64_t queries_per_sequence,
                              int64_t head_dim);

}  // namespace dpa
