// Host-side tile shapes and launch heuristics of the flash forward kernels. Pure functions
// with unit tests (tests/test_flash_tiles.cc); the kernel traits use the same shape function,
// so host decisions and compiled tiles cannot disagree.
#pragma once

#include <cstdint>

namespace dpa::cuda {

struct FlashTileShape {
  int block_m = 0;  // query rows per block
  int block_n = 0;  // keys per KV tile
  int warps = 0;
  int shared_bytes = 0;
};

// Q, K and V tiles with rows padded by 8 elements (16 bytes).
constexpr int flash_forward_shared_bytes(int block_m, int block_n, int head_dim_qk,
                                         int head_dim_v) {
  return 2 * (block_m * (head_dim_qk + 8) + block_n * (head_dim_qk + 8) +
              block_n * (head_dim_v + 8));
}

constexpr FlashTileShape flash_forward_tile_shape(int head_dim_qk, int head_dim_v) {
  // Wide heads use 8 warps of 16 rows to keep the O accumulator in registers; narrow heads
  // 4 warps of 32 rows (half the shared-memory traffic per MMA). Rows are padded by 8
  // elements to keep ldmatrix free of bank conflicts.
  const bool wide = head_dim_qk > 128 || head_dim_v > 128;
  FlashTileShape shape;
  shape.block_m = 128;
  shape.block_n = 64;
  shape.warps = wide ? 8 : 4;
  shape.shared_bytes = flash_forward_shared_bytes(shape.block_m, shape.block_n, head_dim_qk,
                                                  head_dim_v);
  return shape;
}

// The (dqk, dv) pairs with compiled kernels (both dtypes).
bool flash_forward_has_head_dims(int64_t head_dim_qk, int64_t head_dim_v);

// How many ways to split the KV axis so that small-query problems (decode) fill the GPU:
// 1 when the (batch, head, query-block) grid already covers the GPU, else enough splits for
// about two blocks per SM, each covering at least two KV tiles, at most 128.
int choose_num_splits(int64_t batch, int64_t heads, int64_t query_blocks, int64_t kv_blocks,
                      int sm_count);

}  // namespace dpa::cuda
