// Parameters of the flash backward kernels (flash_backward_kernel.cuh): the forward's
// parameters (inputs, sequence tables, features; `o` and `lse` are the saved forward outputs)
// plus dO, the gradients and the per-row workspace. Host-includable.
#pragma once

#include <cstdint>

#include "cuda/flash/flash_params.h"

namespace dpa::cuda {

struct FlashBackwardParams {
  FlashForwardParams fwd;

  const void* d_o = nullptr;  // like o
  int64_t do_batch_stride = 0, do_row_stride = 0, do_head_stride = 0;
  void* dq = nullptr;  // like q
  int64_t dq_batch_stride = 0, dq_row_stride = 0, dq_head_stride = 0;
  void* dk = nullptr;  // like k
  int64_t dk_batch_stride = 0, dk_row_stride = 0, dk_head_stride = 0;
  void* dv = nullptr;  // like v
  int64_t dv_batch_stride = 0, dv_row_stride = 0, dv_head_stride = 0;

  float scale = 1.f;  // the softmax scale (natural units): dq and dk carry it
  // The single-kernel form (sm_90a) instead of the mma.sync pair
  // (flash_backward_sm90_one_kernel.cuh): dq summed in `dq_accum`, [b, H, max_sq rounded up to
  // whole 128-row tiles (dq_workspace_rows), head_dim_qk] fp32, each 64-row tile in fragment order
  // for the narrow form (dq_fragment_offset), zeroed by the prepare kernel
  // (flash_backward_rows.cuh) unless dq_tickets is set, then converted; in any order unless
  // dq_order is set.
  bool one_kernel = false;
  float* dq_accum = nullptr;
  // The narrow kernel's query tile (flash_backward_one_kernel_block_m), which the tensor maps'
  // boxes have; the launch checks it against the kernel's form.
  int query_tile_rows = 0;
  // Deterministic mode of the one-kernel backward: per (batch, head, 64-row query tile) the
  // next key block whose dq partial may be added ([b, H, dq_tiles_per_head] int32, zeroed by the
  // host; kDeterministicKeyChain; a kernel with 128-row tiles uses the first half); null
  // otherwise. Key blocks run in chains of `key_chain`.
  int* dq_order = nullptr;
  int dq_tiles_per_head = 0, key_chain = 0;
  // Where flash_backward_dq_takes_tickets: per (batch, head, 64-row query tile), how many key
  // blocks have taken the tile (the low bits, kDqTicketCount) and whether the first has stored
  // its partial (kDqTicketStored), [b, H, dq_tiles_per_head] int32 zeroed by the host (only at
  // 64-row query tiles). The dq workspace is then not zeroed.
  int* dq_tickets = nullptr;

  // Bulk tensor copies (TMA) of each query tile's Q and dO in the one-kernel backward's producer:
  // boxes of query_tile_rows rows by 64 columns (cuda/tensor_map.h). Only where
  // every query sequence fills its tensor's rows, so that the rows past a sequence are past the
  // tensor and land as zeros (P^T = 0 there, but dk += dU^T Q and dv += P^T dO would turn a
  // non-finite row of other data into NaN). Otherwise the producer's threads copy with cp.async.
  bool tma_query_tiles = false;
  CUtensorMap q_tile_map{}, do_tile_map{};

  // Workspace [b, H, max_sq] fp32: D = rowsum(dO * o) per row, and each row's share of the
  // learnable sink's gradient, -exp(alpha_h - LSE) * D (nullptr when not wanted), both written
  // by the prepare kernel (0 for rows outside a sequence).
  float* row_delta = nullptr;
  float* row_dalpha = nullptr;
};

}  // namespace dpa::cuda
