#include "cuda/flash/flash_tiles.h"

#include <algorithm>

#include "cuda/flash/flash_head_dim_pairs.h"

namespace dpa::cuda {

bool flash_forward_has_head_dims(int64_t head_dim_qk, int64_t head_dim_v) {
  for (const FlashHeadDimPair& pair : kFlashHeadDimPairs)
    if (pair.qk == head_dim_qk && pair.v == head_dim_v) return true;
  return false;
}

int choose_num_splits(int64_t batch, int64_t heads, int64_t query_blocks, int64_t kv_blocks,
                      int sm_count, int blocks_per_sm) {
  const int64_t blocks = batch * heads * query_blocks;
  const int64_t slots = int64_t(sm_count) * std::max(1, blocks_per_sm);
  if (blocks <= 0 || sm_count <= 0 || blocks >= slots) return 1;
  constexpr int64_t kMinTilesPerSplit = 2;
  const int64_t wanted = (slots + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, kv_blocks / kMinTilesPerSplit);
  return int(std::clamp<int64_t>(std::min(wanted, most), 1, kFlashMaxSplits));
}

}  // namespace dpa::cuda
