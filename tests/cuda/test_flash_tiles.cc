// Host-side tile shapes and launch heuristics of the flash kernels (no GPU needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <utility>
#include <vector>

#include "cuda/flash/flash_tiles.h"

namespace dpa::cuda {
namespace {

TEST(FlashTiles, ShapesFitSm80SharedMemoryAndTileTheRows) {
  const int pairs[][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
  for (const auto& pair : pairs) {
    FlashTileShape shape = flash_forward_tile_shape(pair[0], pair[1]);
    EXPECT_LE(shape.shared_bytes, 163 * 1024) << pair[0] << "/" << pair[1];
    EXPECT_EQ(shape.block_m, 16 * shape.warps * shape.slabs);
    FlashTileShape decode = flash_forward_tile_shape(pair[0], pair[1], true);
    EXPECT_EQ(decode.block_m, 16);
    EXPECT_LE(decode.shared_bytes, 163 * 1024);
    EXPECT_EQ(shape.block_n % 16, 0);
    EXPECT_TRUE(flash_forward_has_head_dims(pair[0], pair[1]) || pair[0] != 128);
  }
  EXPECT_EQ(flash_forward_tile_shape(128, 128).warps, 4);
  EXPECT_EQ(flash_forward_tile_shape(256, 256).warps, 8);
  EXPECT_EQ(flash_forward_tile_shape(192, 128).warps, 8);
}

// The wgmma base tile, on which the warp-specialised shape builds.
TEST(FlashTiles, HopperUsesWarpgroupBaseTilesThatFitSm90SharedMemory) {
  const int pairs[][2] = {{64, 64}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};
  for (const auto& pair : pairs) {
    const FlashTileShape shape = flash_forward_tile_shape(pair[0], pair[1], false, true);
    EXPECT_TRUE(shape.wgmma) << pair[0] << "/" << pair[1];
    EXPECT_EQ(shape.block_m, 128);  // two warpgroups of 64 rows
    EXPECT_EQ(shape.warps, 8);
    EXPECT_LE(shape.shared_bytes, 227 * 1024) << pair[0] << "/" << pair[1];
    // Q + two stages of K and V + the 1 KB alignment slack.
    EXPECT_EQ(shape.shared_bytes,
              2 * (128 * pair[0] + 2 * shape.block_n * (pair[0] + pair[1])) + 1024);
    // Each thread copies whole 16-byte chunks: tiles divide evenly over 256 threads.
    EXPECT_EQ(shape.block_n * pair[0] / 8 % 256, 0);
  }
  EXPECT_EQ(flash_forward_tile_shape(128, 128, false, true).block_n, 128);
  EXPECT_EQ(flash_forward_tile_shape(256, 256, false, true).block_n, 64);
  // Head dims that are not multiples of 64 (the swizzle block) and decode shapes keep the
  // mma.sync tiles on Hopper.
  EXPECT_FALSE(flash_forward_tile_shape(96, 96, false, true).wgmma);
  EXPECT_FALSE(flash_forward_tile_shape(128, 128, true, true).wgmma);
  EXPECT_EQ(flash_forward_tile_shape(128, 128, true, true).block_m, 16);
  EXPECT_FALSE(flash_forward_tile_shape(128, 128).wgmma);
}

TEST(FlashTiles, WarpSpecialisedWgmmaTilesFitSharedMemory) {
  const int pairs[][2] = {{64, 64}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};
  for (const auto& pair : pairs) {
    const FlashTileShape shape = flash_forward_wgmma_ws_tile_shape(pair[0], pair[1]);
    const FlashTileShape plain = flash_forward_wgmma_tile_shape(pair[0], pair[1]);
    EXPECT_TRUE(shape.wgmma && shape.warp_specialized) << pair[0] << "/" << pair[1];
    // A producer warpgroup and consumers of 64 rows: three at d = 64, else two.
    const int consumers = pair[0] == 64 ? 3 : 2;
    EXPECT_EQ(flash_forward_wgmma_ws_consumers(pair[0], pair[1]), consumers);
    EXPECT_EQ(shape.warps, 4 * (1 + consumers));
    EXPECT_EQ(shape.block_m, 64 * consumers);
    // The two-warpgroup form's key tile, except 80 keys at d = 256 (FlashAttention-3's).
    EXPECT_EQ(shape.block_n, pair[0] == 256 ? 80 : plain.block_n);
    EXPECT_LE(shape.shared_bytes, 227 * 1024) << pair[0] << "/" << pair[1];
    const int stages =
        flash_forward_wgmma_ws_stages(pair[0], pair[1], shape.block_m, shape.block_n);
    const int q_buffers = kFlashForwardWsQBuffers;
    EXPECT_EQ(shape.shared_bytes, 2 * (q_buffers * shape.block_m * pair[0] +
                                       stages * shape.block_n * (pair[0] + pair[1])) +
                                      1024 + kFlashWsBarrierBytes);
    // Every stage's four mbarriers and each Q buffer's two fit their slot.
    EXPECT_LE(4 * stages + 2 * q_buffers, kFlashWsMbarrierBytes / 8) << pair[0] << "/" << pair[1];
  }
  // d = 128: Q (32 KB) and three 64 KB stages fit; d = 256 (64-key tiles, 64 KB stages) does not.
  EXPECT_EQ(flash_forward_wgmma_ws_stages(128, 128, 128, 128), 3);
  EXPECT_EQ(flash_forward_wgmma_ws_stages(256, 256, 128, 64), 2);
  EXPECT_EQ(flash_forward_wgmma_ws_stages(256, 256, 128, 80), 2);
  // d = 256 keeps 64 keys under a window (measured slower on 80) and with dropout (its keep bits
  // need a power-of-two tile); the other head dims' tiles do not change.
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(256, 256, 4096).block_n, 64);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(256, 256, -1, true).block_n, 64);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(128, 128, 4096, true).block_n, 128);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 4096, true).block_n, 128);
  EXPECT_EQ(flash_forward_wgmma_ws_stages(64, 64, 192, 128), 3);
  // Narrow windows keep two consumer warpgroups at d = 64 (a 192-row block would see 191 more
  // keys than one query does); wider ones, or none, take three.
  EXPECT_EQ(flash_forward_wgmma_ws_consumers(64, 64, 128), 2);
  EXPECT_EQ(flash_forward_wgmma_ws_consumers(64, 64, kFlashNarrowWindowKeys), 2);
  EXPECT_EQ(flash_forward_wgmma_ws_consumers(64, 64, kFlashNarrowWindowKeys + 1), 3);
  EXPECT_EQ(flash_forward_wgmma_ws_consumers(64, 64, -1), 3);
  EXPECT_EQ(flash_forward_wgmma_ws_consumers(128, 128, 1024), 2);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128).block_m, 128);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128).warps, 12);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 1024).block_m, 192);
  // GQA packing: head dim 64 under a narrow window, 4 or 8 query heads per KV head, on 64-key
  // tiles with four consumers (256 rows); not with dropout, a wide window, no window, other
  // groups or head dims.
  const FlashTileShape packed = flash_forward_wgmma_ws_tile_shape(64, 64, 128, false, 8);
  EXPECT_EQ(packed.packed_heads, 8);
  EXPECT_EQ(packed.block_n, kFlashPackedBlockN);
  EXPECT_EQ(packed.block_m, 64 * kFlashPackedConsumers);
  EXPECT_EQ(packed.warps, 4 * (1 + kFlashPackedConsumers));
  EXPECT_LE(packed.shared_bytes, 227 * 1024);
  EXPECT_EQ(
      flash_forward_wgmma_ws_tile_shape(64, 64, kFlashPackedWindowKeys + 1, false, 4).packed_heads,
      1);
  EXPECT_EQ(
      flash_forward_wgmma_ws_tile_shape(64, 64, kFlashPackedWindowKeys, false, 4).packed_heads, 4);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128, true, 8).packed_heads, 1);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128, true, 8).block_n, 128);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, -1, false, 8).packed_heads, 1);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128, false, 16).packed_heads, 1);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128, false, 2).packed_heads, 1);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(128, 128, 128, false, 8).packed_heads, 1);
  EXPECT_EQ(flash_forward_wgmma_ws_tile_shape(64, 64, 128).block_n, 128);  // no GQA
  EXPECT_EQ(flash_forward_packable_group(64, 8, false, true), 8);
  EXPECT_EQ(flash_forward_packable_group(64, 8, true, true), 1);    // thd
  EXPECT_EQ(flash_forward_packable_group(64, 8, false, false), 1);  // keys end inside the tensor
  // Every packed block divides into 16-row slabs of one head each.
  EXPECT_EQ(packed.block_m % (16 * packed.packed_heads), 0);
  // Q's rows count: 256 rows of d = 128 (64 KB) leave room for two 64 KB stages only.
  EXPECT_EQ(flash_forward_wgmma_ws_stages(128, 128, 256, 128), 2);
}

TEST(FlashTiles, BackwardTilesFitSharedMemory) {
  const int pairs[][2] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};
  for (const auto& pair : pairs) {
    const int bytes = flash_backward_shared_bytes(pair[0], pair[1]);
    EXPECT_LE(bytes, 163 * 1024) << pair[0] << "/" << pair[1];  // sm_80's opt-in maximum
    EXPECT_EQ(bytes, std::max(flash_backward_dq_shared_bytes(pair[0], pair[1]),
                              flash_backward_dkdv_shared_bytes(pair[0], pair[1])));
  }
  // Wide heads take 32-key dq tiles (the dq accumulator alone is 128 registers per thread).
  EXPECT_EQ(flash_backward_dq_block_n(128, 128), 64);
  EXPECT_EQ(flash_backward_dq_block_n(256, 256), 32);
  EXPECT_EQ(flash_backward_dq_block_n(192, 128), 32);
  // d = 128: Q and dO (64 rows) and two stages of 64-key K and V, rows padded to 136.
  EXPECT_EQ(flash_backward_dq_shared_bytes(128, 128), 2 * (64 + 128) * 272);
  // sm_86 / sm_89 (99 KB per block) fit the narrow heads only: the selector checks the device.
  EXPECT_LE(flash_backward_shared_bytes(96, 96), 99 * 1024);
  EXPECT_GT(flash_backward_shared_bytes(128, 128), 99 * 1024);
}

// The plan carries the bytes of the family that runs (the selector's rule checks them), and they
// fit sm_90: the traits assert the same sizes against their layouts at compile time.
TEST(FlashTiles, BackwardPlanSizesTheFamilyThatRuns) {
  using F = FlashBackwardFamily;
  struct Expected {
    int arch, dqk, dv;
    bool dropout;
    F family;
    int bytes;
  };
  const Expected cases[] = {
      {90, 128, 128, false, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(128, 128, false, 64)},
      {90, 64, 64, false, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(64, 64, false, 128)},
      {90, 256, 256, false, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(256, 256, false, 64)},
      {90, 192, 192, false, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(192, 192, false, 64)},
      {90, 192, 128, false, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(192, 128, false, 64)},
      {90, 96, 96, false, F::kMmaSync, flash_backward_shared_bytes(96, 96)},
      {90, 128, 128, true, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(128, 128, true, 64)},
      {90, 256, 256, true, F::kMmaSync, flash_backward_shared_bytes(256, 256)},
      {90, 192, 128, true, F::kOneKernel,
       flash_backward_one_kernel_shared_bytes(192, 128, true, 64)},
      {80, 128, 128, false, F::kMmaSync, flash_backward_shared_bytes(128, 128)},
  };
  for (const Expected& e : cases) {
    const FlashBackwardPlan plan =
        flash_backward_plan(e.arch, e.dqk, e.dv, e.dropout, F::kAutomatic, -1);
    EXPECT_EQ(plan.family, e.family) << e.arch << " " << e.dqk;
    EXPECT_EQ(plan.shared_bytes, e.bytes) << e.arch << " " << e.dqk;
    EXPECT_LE(plan.shared_bytes, 227 * 1024);
  }
  EXPECT_EQ(flash_backward_plan(90, 128, 128, false, F::kMmaSync, -1).shared_bytes,
            flash_backward_shared_bytes(128, 128));
  // Head dim 64's tiles follow the window, and so do their bytes.
  EXPECT_EQ(flash_backward_plan(90, 64, 64, false, F::kAutomatic, 128).shared_bytes,
            flash_backward_one_kernel_shared_bytes(64, 64, false, 64));
  EXPECT_EQ(flash_backward_plan(90, 64, 64, false, F::kAutomatic, 128).query_tile_rows, 64);
  EXPECT_EQ(flash_backward_plan(90, 64, 64, false, F::kAutomatic, 1024).query_tile_rows, 128);
  // The families' sizes differ: a rule that checked one family's bytes for another would be
  // checking the wrong number.
  EXPECT_NE(flash_backward_one_kernel_shared_bytes(128, 128, false, 64),
            flash_backward_shared_bytes(128, 128));
  // At head dim 128 the narrow form keeps two dq tiles either way; dropout's keep words take the
  // room of the second dU^T buffer.
  EXPECT_EQ(flash_backward_one_kernel_dq_buffers(128), 2);
  EXPECT_EQ(flash_backward_one_kernel_du_buffers(128, false), 2);
  EXPECT_EQ(flash_backward_one_kernel_du_buffers(128, true), 1);
  EXPECT_EQ(flash_backward_one_kernel_shared_bytes(128, 128, false, 64) -
                flash_backward_one_kernel_shared_bytes(128, 128, true, 64),
            128 * 64 * 2 - 2 * 256 * 4);
  // Head dim 64 keeps one dq tile and two dU^T buffers either way; without dropout its query
  // tiles are 128 rows: K and V, two stages of Q and dO, their rows' LSE and D, two dU^T buffers
  // of 128 x 128, the dq tile, the barriers and the alignment pad.
  EXPECT_EQ(flash_backward_one_kernel_dq_buffers(64), 1);
  EXPECT_EQ(flash_backward_one_kernel_du_buffers(64, true), 2);
  // Tickets where the producer's threads add the tiles: head dim 64 without dropout (whose tiles
  // the consumers add) outside deterministic mode (which orders the adds by flags); not head dim
  // 128 (the copy engine's bulk reductions) nor the wide form; and only at 64-row query tiles
  // (narrow windows), where few key blocks share a tile.
  EXPECT_TRUE(flash_backward_dq_takes_tickets(64, 64, false, false, 64));
  EXPECT_FALSE(flash_backward_dq_takes_tickets(64, 64, true, false, 64));
  EXPECT_FALSE(flash_backward_dq_takes_tickets(64, 64, false, true, 64));
  EXPECT_FALSE(flash_backward_dq_takes_tickets(128, 128, false, false, 64));
  EXPECT_FALSE(flash_backward_dq_takes_tickets(256, 256, false, false, 64));
  EXPECT_FALSE(flash_backward_dq_takes_tickets(64, 64, false, false, 128));
  EXPECT_EQ(kDqTicketCount & kDqTicketStored, 0);
  EXPECT_EQ(flash_backward_one_kernel_shared_bytes(64, 64, false, 128),
            2 * 128 * 128 + 2 * 2 * 128 * 128 + 2 * 2 * 128 * 4 + 2 * 128 * 128 * 2 + 128 * 64 * 4 +
                128 + 1024);
  // With dropout, 64-row tiles and the keep words.
  EXPECT_EQ(flash_backward_one_kernel_shared_bytes(64, 64, true, 64),
            2 * 128 * 128 + 2 * 2 * 64 * 128 + 2 * 2 * 64 * 4 + 2 * 128 * 64 * 2 + 64 * 64 * 4 +
                2 * 256 * 4 + 128 + 1024);
}

// The one-kernel backward takes dropout at head dims 64, 128, 192 and 192 / 128, not at 256 (its
// wide form's keep words do not fit there), whatever config.flash_backward_kernel asks; every
// form takes deterministic mode, so it does not enter the choice. Off sm_90 or at head dim 96
// every request gets mma.sync.
TEST(FlashTiles, BackwardFamilyHonoursDropout) {
  using F = FlashBackwardFamily;
  for (F requested : {F::kAutomatic, F::kOneKernel}) {
    EXPECT_EQ(flash_backward_family(90, 128, 128, false, requested), F::kOneKernel);
    EXPECT_EQ(flash_backward_family(90, 64, 64, false, requested), F::kOneKernel);
    EXPECT_EQ(flash_backward_family(90, 128, 128, true, requested), F::kOneKernel);
    EXPECT_EQ(flash_backward_family(90, 64, 64, true, requested), F::kOneKernel);
    for (const auto& [dqk, dv] : {std::pair{256, 256}, {192, 192}, {192, 128}}) {
      EXPECT_EQ(flash_backward_family(90, dqk, dv, false, requested), F::kOneKernel) << dqk;
      EXPECT_EQ(flash_backward_family(90, dqk, dv, true, requested),
                dqk == 256 ? F::kMmaSync : F::kOneKernel)
          << dqk;
      EXPECT_EQ(flash_backward_family(80, dqk, dv, false, requested), F::kMmaSync) << dqk;
    }
    EXPECT_FALSE(flash_backward_wide_takes_dropout(256, 256));
    EXPECT_TRUE(flash_backward_wide_takes_dropout(192, 192));
    EXPECT_TRUE(flash_backward_wide_takes_dropout(192, 128));
    EXPECT_FALSE(flash_backward_wide_takes_dropout(128, 128));  // the narrow form's
    EXPECT_EQ(flash_backward_family(90, 96, 96, false, requested), F::kMmaSync);
    EXPECT_EQ(flash_backward_family(80, 128, 128, false, requested), F::kMmaSync);
  }
  // The mma.sync pair when asked, on any device and head dim, with every feature.
  EXPECT_EQ(flash_backward_family(90, 128, 128, false, F::kMmaSync), F::kMmaSync);
  EXPECT_EQ(flash_backward_family(90, 128, 128, true, F::kMmaSync), F::kMmaSync);
  EXPECT_EQ(flash_backward_family(80, 128, 128, false, F::kMmaSync), F::kMmaSync);
  EXPECT_EQ(flash_backward_family(90, 256, 256, false, F::kMmaSync), F::kMmaSync);
}

// Deterministic mode's order flags count key blocks of the form that runs: 128 keys in the
// narrow form, 64 in the wide one.
TEST(FlashTiles, OneKernelKeyBlockFollowsTheForm) {
  EXPECT_EQ(flash_backward_one_kernel_block_n(64, 64), 128);
  EXPECT_EQ(flash_backward_one_kernel_block_n(128, 128), 128);
  EXPECT_EQ(flash_backward_one_kernel_block_n(256, 256), 64);
  EXPECT_EQ(flash_backward_one_kernel_block_n(192, 192), 64);
  EXPECT_EQ(flash_backward_one_kernel_block_n(192, 128), 64);
}

// The narrow form's dq tile in fragment order: every element of a 64-row tile has its own float
// (a bijection onto the tile's 64 x dqk floats), and dq_fragment_position inverts it as the
// conversion pass reads the tile, a float4 at a time.
TEST(FlashTiles, NarrowDqTileInFragmentOrderCoversTheTileOnce) {
  for (int dim : {64, 128}) {
    std::vector<int> hits(size_t(64 * dim), 0);
    for (int row = 0; row < 64; ++row)
      for (int column = 0; column < dim; ++column) {
        const int offset = dq_fragment_offset(row, column, dim);
        ASSERT_GE(offset, 0);
        ASSERT_LT(offset, 64 * dim);
        ++hits[size_t(offset)];
      }
    EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), 64 * dim) << "dim " << dim;
    // The reads of the conversion pass and of the kernel's dq writes: float4 i holds two columns
    // of row r and of row r + 8, over two 64-row tiles in a row (a 128-row query tile).
    for (int i = 0; i < 2 * 16 * dim; ++i) {
      const DqFragmentPosition at = dq_fragment_position(i, dim);
      const int tile = i / (16 * dim), in_tile = i % (16 * dim);
      ASSERT_EQ(at.row / 64, tile) << "float4 " << i;
      for (int e = 0; e < 2; ++e) {
        EXPECT_EQ(dq_fragment_offset(at.row % 64, at.column + e, dim), 4 * in_tile + e)
            << "float4 " << i;
        EXPECT_EQ(dq_fragment_offset(at.row % 64 + 8, at.column + e, dim), 4 * in_tile + 2 + e)
            << "float4 " << i;
      }
    }
  }
  // The consumers' stores: element e of n8 tile t of warpgroup thread w (wgmma's accumulator
  // fragment: rows 16 (w / 32) + g and + 8, columns 2q and 2q + 1 of the tile) of consumer c.
  for (int dim : {64, 128})
    for (int c = 0; c < 2; ++c)
      for (int w = 0; w < 128; ++w)
        for (int t = 0; t < dim / 16; ++t)
          for (int e = 0; e < 4; ++e) {
            const int row = w / 32 * 16 + w % 32 / 4 + 8 * (e / 2);
            const int column = c * dim / 2 + 8 * t + 2 * (w % 4) + e % 2;
            ASSERT_EQ(dq_fragment_offset(row, column, dim), c * 32 * dim + 512 * t + 4 * w + e)
                << "dim " << dim << ", thread " << w << ", tile " << t << ", element " << e;
          }
  // Whole 128-row tiles, so that either form's tiles are whole ranges of the workspace.
  EXPECT_EQ(dq_workspace_rows(0), 0);
  EXPECT_EQ(dq_workspace_rows(1), 128);
  EXPECT_EQ(dq_workspace_rows(128), 128);
  EXPECT_EQ(dq_workspace_rows(129), 256);
  EXPECT_EQ(dq_workspace_rows(1025), 1152);
}

// The narrow form's query tile: 128 rows only at head dim 64 without dropout (the dropout form's
// keep words cover 64 queries) and without a narrow window (at most kFlashNarrowWindowKeys keys
// per query, as the forward's rule); 64 elsewhere, the wide form's included. Either divides the
// workspace's rows.
TEST(FlashTiles, NarrowQueryTileIs128RowsOnlyAtHeadDim64WithoutDropoutOrANarrowWindow) {
  for (int64_t span : {int64_t(-1), kFlashNarrowWindowKeys + 1, int64_t(1024)}) {
    EXPECT_EQ(flash_backward_one_kernel_block_m(64, 64, false, span), 128) << span;
    EXPECT_EQ(flash_backward_one_kernel_block_m(64, 64, true, span), 64) << span;
    EXPECT_EQ(flash_backward_one_kernel_block_m(128, 128, false, span), 64) << span;
    EXPECT_EQ(flash_backward_one_kernel_block_m(128, 128, true, span), 64) << span;
    EXPECT_EQ(flash_backward_one_kernel_block_m(256, 256, false, span), 64) << span;
    EXPECT_EQ(flash_backward_one_kernel_block_m(192, 128, false, span), 64) << span;
  }
  for (int64_t span : {int64_t(1), int64_t(128), kFlashNarrowWindowKeys})
    EXPECT_EQ(flash_backward_one_kernel_block_m(64, 64, false, span), 64) << span;
  for (int rows : {1, 63, 64, 65, 127, 128, 129, 1000})
    for (bool dropout : {false, true})
      for (int dim : {64, 128, 256})
        EXPECT_EQ(
            dq_workspace_rows(rows) % flash_backward_one_kernel_block_m(dim, dim, dropout, -1), 0)
            << rows;
}

// The wide form's consumers split the head dims in whole 64-column blocks, each keeping some of
// dk (and so of dq), and the products' widths as even as whole blocks allow (dk's columns count
// twice: dk += dU^T Q and dq = dU K).
TEST(FlashTiles, WideBackwardSplitsTheHeadDimsEvenly) {
  struct Expected {
    int dqk, dv, qk_blocks, v_blocks;
  };
  for (const Expected& e : {Expected{256, 256, 2, 2}, {192, 192, 2, 1}, {192, 128, 2, 0}}) {
    const FlashBackwardWideSplit split = flash_backward_wide_split(e.dqk, e.dv);
    EXPECT_EQ(split.qk_blocks, e.qk_blocks) << e.dqk << "/" << e.dv;
    EXPECT_EQ(split.v_blocks, e.v_blocks) << e.dqk << "/" << e.dv;
    const int width0 = 2 * 64 * split.qk_blocks + 64 * split.v_blocks;
    const int width1 = 2 * (e.dqk - 64 * split.qk_blocks) + (e.dv - 64 * split.v_blocks);
    EXPECT_LE(std::abs(width0 - width1), 64) << e.dqk << "/" << e.dv;
    EXPECT_GT(split.qk_blocks, 0);
    EXPECT_LT(64 * split.qk_blocks, e.dqk);
  }
}

// The dk/dv kernels walk only the query rows queries_seeing_keys returns: it must be exactly the
// rows that see some key of the block (DESIGN.md §3), for any window, alignment or CP diagonal.
TEST(FlashTiles, QueriesSeeingKeysIsExact) {
  std::mt19937 rng(7);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 20000; ++trial) {
    const int seqlen_q = draw(1, 90), seqlen_kv = draw(1, 90);
    const int diagonal = draw(-seqlen_q - 5, seqlen_kv + 5);
    const int window_left = draw(0, 3) == 0 ? -1 : draw(0, 60);
    const int window_right = draw(0, 3) == 0 ? -1 : draw(0, 60);
    const int first_key = draw(0, seqlen_kv - 1);
    const int last_key = std::min(seqlen_kv - 1, first_key + draw(0, 20));
    int lowest = seqlen_q, highest = -1;
    for (int i = 0; i < seqlen_q; ++i)
      for (int j = first_key; j <= last_key; ++j) {
        const bool left_ok = window_left < 0 || j >= i + diagonal - window_left;
        const bool right_ok = window_right < 0 || j <= i + diagonal + window_right;
        if (left_ok && right_ok) {
          lowest = std::min(lowest, i);
          highest = std::max(highest, i);
        }
      }
    const QueryRange range =
        queries_seeing_keys(first_key, last_key, seqlen_q, diagonal, window_left, window_right);
    if (highest < 0) {
      EXPECT_LT(range.last, range.first) << "trial " << trial << ": no row sees the keys";
    } else {
      EXPECT_EQ(range.first, lowest) << "trial " << trial;
      EXPECT_EQ(range.last, highest) << "trial " << trial;
    }
  }
}

TEST(FlashTiles, HeadDimPairsWithoutKernelsAreReported) {
  EXPECT_TRUE(flash_forward_has_head_dims(128, 128));
  EXPECT_FALSE(flash_forward_has_head_dims(128, 64));
  EXPECT_FALSE(flash_forward_has_head_dims(80, 80));
  EXPECT_FALSE(flash_forward_has_head_dims(512, 512));
}

TEST(FlashTiles, LargeProblemsDoNotSplit) {
  // b=2, H=16, s=8192: 2 * 16 * 64 query blocks already fill 132 SMs many times over.
  EXPECT_EQ(choose_num_splits(2, 16, 64, 128, 132, 2), 1);
}

TEST(FlashTiles, DecodeSplitsTheKeysToFillTheGpu) {
  // sq = 1 against 32k keys, 64 query heads: 64 one-warp blocks on 132 SMs x 4 slots.
  const int splits = choose_num_splits(1, 64, 1, 512, 132, 4);
  EXPECT_GE(splits * 64, 132 * 4) << "the split grid must fill every resident-block slot";
  EXPECT_LE(splits, 128);
  EXPECT_LE(splits, 512 / 2) << "each split keeps at least two KV tiles";
}

TEST(FlashTiles, ShortKeysLimitTheSplits) {
  EXPECT_EQ(choose_num_splits(1, 1, 1, 1, 132, 2), 1);
  EXPECT_EQ(choose_num_splits(1, 1, 1, 6, 132, 2), 3);
}

}  // namespace
// The deterministic one-kernel backward adds a query tile's dq partials in key-block order, each
// block waiting for the previous one when that block adds to the tile too. That order is
// complete only if every tile's contributing key blocks are contiguous (else a block would wait
// for one that never adds); and it cannot deadlock only if a block waits for blocks of a lower
// linear grid index (dispatched before it). Both for any lengths, window and diagonal.
TEST(FlashTiles, DeterministicDqOrderIsCompleteAndAcyclic) {
  constexpr int kBlockN = 128, kBlockM = 64;
  std::mt19937 rng(11);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 3000; ++trial) {
    const int seqlen_q = draw(1, 1500), seqlen_kv = draw(1, 1500);
    const int diagonal = draw(-seqlen_q - 5, seqlen_kv + 5);
    const int window_left = draw(0, 2) == 0 ? -1 : draw(0, 400);
    const int window_right = draw(0, 2) == 0 ? -1 : draw(0, 400);
    const int key_blocks = (seqlen_kv + kBlockN - 1) / kBlockN;
    const int query_tiles = (seqlen_q + kBlockM - 1) / kBlockM;
    std::vector<QueryTileSpan> spans;
    for (int n = 0; n <= key_blocks; ++n)  // one past the last: empty
      spans.push_back(key_block_query_tiles(n * kBlockN, kBlockN, kBlockM, seqlen_q, seqlen_kv,
                                            diagonal, window_left, window_right));
    EXPECT_LT(spans.back().last, spans.back().first) << "trial " << trial;
    for (int m = 0; m < query_tiles; ++m) {
      int first = -1, last = -1;
      for (int n = 0; n < key_blocks; ++n) {
        if (spans[size_t(n)].first > m || m > spans[size_t(n)].last) continue;
        if (first < 0) first = n;
        EXPECT_EQ(last, first < n ? n - 1 : -1)
            << "trial " << trial << ": tile " << m << "'s key blocks are not contiguous";
        last = n;
      }
    }
  }
  // Chains: every key block once, each block's predecessor at a lower linear index.
  for (int batch_count : {1, 3}) {
    for (int key_blocks : {1, 15, 16, 17, 64, 100}) {
      const int chain = deterministic_key_chain(batch_count, key_blocks);
      const int chains = (key_blocks + chain - 1) / chain, heads = 2;
      std::vector<int64_t> linear(size_t(batch_count * key_blocks), -1);
      for (int z = 0; z < batch_count * chains; ++z)
        for (int y = 0; y < heads; ++y)
          for (int x = 0; x < chain; ++x) {
            const KeyBlockCoordinates c = deterministic_key_block(x, z, batch_count, chain);
            ASSERT_LT(c.batch, batch_count);
            if (c.key_block >= key_blocks || y != 0) continue;
            int64_t& slot = linear[size_t(c.batch * key_blocks + c.key_block)];
            EXPECT_EQ(slot, -1) << "key block " << c.key_block << " twice";
            slot = x + int64_t(chain) * (y + int64_t(heads) * z);
          }
      for (int b = 0; b < batch_count; ++b)
        for (int n = 0; n < key_blocks; ++n) {
          EXPECT_GE(linear[size_t(b * key_blocks + n)], 0) << "key block " << n << " missing";
          if (n > 0) {
            EXPECT_LT(linear[size_t(b * key_blocks + n - 1)], linear[size_t(b * key_blocks + n)]);
          }
        }
    }
  }
  // Past the grid's z limit the chain is the whole sequence (the usual order).
  EXPECT_EQ(deterministic_key_chain(65535, 17), 17);
  EXPECT_EQ(deterministic_key_chain(2, 64), kDeterministicKeyChain);
}

}  // namespace dpa::cuda
