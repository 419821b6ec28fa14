#include "cuda/flash/flash_tiles.h"

#include <algorithm>

namespace dpa::cuda {

bool flash_forward_has_head_dims(int64_t head_dim_qk, int64_t head_dim_v) {
#if defined(DPA_MINIMAL_CUDA)
  return head_dim_qk == 128 && head_dim_v == 128;
#else
  if (head_dim_qk == 192 && head_dim_v == 128) return true;  // MLA
  if (head_dim_qk != head_dim_v) return false;
  return head_dim_qk == 64 || head_dim_qk == 96 || head_dim_qk == 128 || head_dim_qk == 192 ||
         head_dim_qk == 256;
#endif
}

int choose_num_splits(int64_t batch, int64_t heads, int64_t query_blocks, int64_t kv_blocks,
                      int sm_count, int blocks_per_sm) {
  const int64_t blocks = batch * heads * query_blocks;
  const int64_t slots = int64_t(sm_count) * std::max(1, blocks_per_sm);
  if (blocks <= 0 || sm_count <= 0 || blocks >= slots) return 1;
  constexpr int64_t kMinTilesPerSplit = 2;
  constexpr int64_t kMaxSplits = 128;
  const int64_t wanted = (slots + blocks - 1) / blocks;
  const int64_t most = std::max<int64_t>(1, kv_blocks / kMinTilesPerSplit);
  return int(std::clamp<int64_t>(std::min(wanted, most), 1, kMaxSplits));
}

}  // namespace dpa::cuda
