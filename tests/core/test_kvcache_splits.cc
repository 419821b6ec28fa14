// The KV-cache kernel's split heuristic (core/kvcache_splits.h), on the host.
#include <gtest/gtest.h>

#include "core/kvcache_splits.h"

namespace dpa {
namespace {

constexpr int64_t kH200Slots = 132 * 2;  // 132 SMs, two blocks each

TEST(KvCacheSplits, ADeviceAlreadyFullIsNotSplit) {
  EXPECT_EQ(kvcache_num_splits(kH200Slots, 512, kH200Slots), 1);
  EXPECT_EQ(kvcache_num_splits(10 * kH200Slots, 512, kH200Slots), 1);
  EXPECT_EQ(kvcache_num_splits(0, 512, kH200Slots), 1);
}

TEST(KvCacheSplits, FewBlocksSplitLongKeysToFillTheWaves) {
  // Decode, b = 1, 8 KV heads, 32k keys: eight blocks would leave 256 of 264 slots idle.
  const int splits = kvcache_num_splits(8, 513, kH200Slots);
  EXPECT_GE(8 * splits, int64_t(0.85 * kH200Slots));
  EXPECT_LE(8 * splits, kH200Slots);  // the fewest that fill the wave: no second wave
  // b = 16: 128 blocks; two splits fill 256 of 264 slots.
  EXPECT_EQ(kvcache_num_splits(128, 513, kH200Slots), 2);
}

TEST(KvCacheSplits, EverySplitKeepsItsMinimumOfTiles) {
  // Five tiles give at most two splits of two tiles each.
  EXPECT_EQ(kvcache_num_splits(1, 5, kH200Slots), 2);
  EXPECT_EQ(kvcache_num_splits(1, 3, kH200Slots), 1);
  EXPECT_LE(kvcache_num_splits(1, 100000, kH200Slots), kKvCacheMaxSplits);
}

TEST(KvCacheSplits, AWindowBoundsTheKeyTiles) {
  EXPECT_EQ(kvcache_key_tiles(32768, -1, 0, 1), 32768 / 64 + 1);
  // A 128-key window (left 127, causal) over one query: at most three tiles.
  EXPECT_EQ(kvcache_key_tiles(32768, 127, 0, 1), 3);
  // An unbounded right side leaves the capacity.
  EXPECT_EQ(kvcache_key_tiles(32768, 127, -1, 1), 32768 / 64 + 1);
  EXPECT_EQ(kvcache_key_tiles(0, -1, -1, 1), 1);
}

TEST(KvCacheSplits, OnlySplitsOfFewTilesTakeTheDeepPipeline) {
  // b = 1 at 32k keys: 513 tiles over 33-48 splits, 11-16 tiles each.
  EXPECT_TRUE(kvcache_deep_pipeline(513, 33));
  EXPECT_TRUE(kvcache_deep_pipeline(513, 48));
  // b = 16: 2-3 splits of about 171-257 tiles each.
  EXPECT_FALSE(kvcache_deep_pipeline(513, 3));
  EXPECT_FALSE(kvcache_deep_pipeline(513, 2));
  // An unsplit launch keeps the default whatever its tiles.
  EXPECT_FALSE(kvcache_deep_pipeline(3, 1));
  EXPECT_TRUE(kvcache_deep_pipeline(kKvCacheDeepPipelineTiles * 8, 8));
  EXPECT_FALSE(kvcache_deep_pipeline(kKvCacheDeepPipelineTiles * 8 + 1, 8));
}

TEST(KvCacheSplits, AWholeWindowInFlightOnlyInOneWave) {
  // A 128-key window over one query (three tiles) at d = 128's three deep stages, b = 16 x 8 KV
  // heads = 128 blocks against 132 SMs x 2 deep blocks.
  EXPECT_TRUE(kvcache_whole_range_in_flight(3, 1, 3, 128, 264));
  EXPECT_TRUE(kvcache_whole_range_in_flight(2, 1, 3, 264, 264));
  // More blocks than fit at once: the default's more blocks per SM cost no extra wave.
  EXPECT_FALSE(kvcache_whole_range_in_flight(3, 1, 3, 265, 264));
  // More tiles than the deep stages, or a split launch (kvcache_deep_pipeline's case).
  EXPECT_FALSE(kvcache_whole_range_in_flight(4, 1, 3, 128, 264));
  EXPECT_FALSE(kvcache_whole_range_in_flight(3, 2, 3, 128, 264));
}

TEST(KvCacheSplits, OnlyLongPrefillChunksOnHopperRunOnTheFlashForward) {
  EXPECT_TRUE(kvcache_prefill_on_flash(90, false, 512, 128));
  EXPECT_TRUE(kvcache_prefill_on_flash(90, false, kKvCacheFlashPrefillQueries, 64));
  EXPECT_FALSE(kvcache_prefill_on_flash(90, false, kKvCacheFlashPrefillQueries - 1, 128));
  EXPECT_FALSE(kvcache_prefill_on_flash(90, false, 1, 128));    // decode
  EXPECT_FALSE(kvcache_prefill_on_flash(90, true, 4096, 128));  // packed: counts on device
  EXPECT_FALSE(kvcache_prefill_on_flash(90, false, 512, 256));  // no paged d = 256 kernel
  EXPECT_FALSE(kvcache_prefill_on_flash(80, false, 512, 128));  // sm_90a code only
}

}  // namespace
}  // namespace dpa
