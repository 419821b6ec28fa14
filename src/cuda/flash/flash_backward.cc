// cuda_flash backward orchestration: validated problem -> kernel parameters, workspace, the
// rows outside every sequence, the kernels and the sink gradient's reduction.

#include <optional>

#include "core/problem.h"
#include "core/workspace.h"
#include "cuda/device_buffer.h"
#include "cuda/fill_rows.h"
#include "cuda/flash/flash_backward_launch.h"
#include "cuda/flash/flash_forward_plan.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/runtime.h"
#include "cuda/tensor_map.h"
#include "cuda/unfused/unfused_kernels.h"
#include "dpa/error.h"

namespace dpa::cuda {

void launch_flash_backward(const FlashBackwardParams& p, DType dtype, int head_dim_qk,
                           int head_dim_v, cudaStream_t stream) {
#define DPA_FLASH_BACKWARD_PAIR(QK, V)      \
  if (head_dim_qk == QK && head_dim_v == V) \
    return launch_flash_backward_dims<QK, V>(p, dtype, stream);
  DPA_FLASH_HEAD_DIM_PAIRS(DPA_FLASH_BACKWARD_PAIR)
#undef DPA_FLASH_BACKWARD_PAIR
  throw Error(ErrorCode::kInternal, "",
              "flash backward selected for head dims without kernels (the selector must reject "
              "these)");
}

namespace {

// The plan the selector's rule checked (flash_backend.cc), from the same inputs.
FlashBackwardPlan backward_plan(const AttentionProblem& p) {
  return flash_backward_plan(p.device_arch, int(p.head_dim_qk), int(p.head_dim_v),
                             p.dropout_threshold != 0,
                             requested_backward_family(p.flash_backward_kernel), p.window_span());
}

// The one-kernel backward's 64-row query tiles per (batch, head), and their count over the
// batch's heads: one order flag each in deterministic mode, else one ticket word each where
// flash_backward_dq_takes_tickets.
int64_t dq_tiles_per_head(const AttentionProblem& p) {
  constexpr int64_t kTileRows = kOneKernelBackwardBlockM;
  return (p.max_seqlen_q + kTileRows - 1) / kTileRows;
}
size_t dq_tile_count(const AttentionProblem& p) {
  return size_t(p.batch * p.heads_q * dq_tiles_per_head(p));
}

// The backward's own buffers, by family.
struct FlashBackwardBuffers {
  size_t dq_accum = 0;    // fp32 [b, H, sq rounded up to whole tiles, dqk], one-kernel family
  size_t dq_order = 0;    // int32 [b, H, query tiles], the one-kernel family in deterministic mode
  size_t dq_tickets = 0;  // int32 [b, H, query tiles], where flash_backward_dq_takes_tickets
  size_t row_delta = 0;   // fp32 [b, H, sq] D_i
  size_t row_dalpha = 0;  // fp32 [b, H, sq] per-row sink gradient terms
};

FlashBackwardBuffers flash_backward_buffers(const AttentionProblem& p, FlashBackwardFamily family) {
  const size_t rows = size_t(p.batch * p.heads_q * p.max_seqlen_q);
  FlashBackwardBuffers sizes;
  if (family == FlashBackwardFamily::kOneKernel) {
    sizes.dq_accum = size_t(p.batch * p.heads_q * dq_workspace_rows(p.max_seqlen_q)) *
                     size_t(p.head_dim_qk) * sizeof(float);
    if (p.deterministic) sizes.dq_order = dq_tile_count(p) * sizeof(int);
    if (flash_backward_dq_takes_tickets(int(p.head_dim_qk), int(p.head_dim_v),
                                        p.dropout_threshold != 0, p.deterministic,
                                        backward_plan(p).query_tile_rows))
      sizes.dq_tickets = dq_tile_count(p) * sizeof(int);
  }
  sizes.row_delta = rows * sizeof(float);
  if (p.wants_dsoftmax_offset) sizes.row_dalpha = rows * sizeof(float);
  return sizes;
}

// TMA copies of the one-kernel backward's query tiles (FlashBackwardParams::tma_query_tiles):
// where every query sequence fills its tensor's rows and the maps can address Q and dO.
// Otherwise (or where the driver will not encode a map) the producer copies with cp.async.
void plan_query_tile_maps(const AttentionProblem& p, FlashBackwardParams& bp) {
  if (!bp.one_kernel || !p.queries_fill_rows()) return;
  const RowTensor q =
      row_tensor(p.q, p.q_rows, p.dtype, p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_qk);
  const RowTensor d_o =
      row_tensor(p.d_o, p.do_rows, p.dtype, p.batch, p.max_seqlen_q, p.heads_q, p.head_dim_v);
  if (!tensor_map_can_address(q) || !tensor_map_can_address(d_o)) return;
  const std::optional<CUtensorMap> q_map = encode_row_tensor_map(q, bp.query_tile_rows);
  const std::optional<CUtensorMap> do_map = encode_row_tensor_map(d_o, bp.query_tile_rows);
  if (!q_map || !do_map) return;
  bp.q_tile_map = *q_map;
  bp.do_tile_map = *do_map;
  bp.tma_query_tiles = true;
}

}  // namespace

size_t flash_backward_workspace_bytes(const AttentionProblem& p) {
  const FlashBackwardBuffers sizes = flash_backward_buffers(p, backward_plan(p).family);
  return workspace_bytes_for({sequence_tables_bytes(p), sizes.dq_accum, sizes.dq_order,
                              sizes.dq_tickets, sizes.row_delta, sizes.row_dalpha});
}

void run_flash_backward(const AttentionProblem& p, cudaStream_t stream) {
  // The forward's parameters (sequence tables, features, q/k/v/o/lse) with one split: the
  // backward kernels walk every visible tile themselves, and copy Q and dO by their own tensor
  // maps (plan_query_tile_maps).
  const FlashTileShape shape =
      flash_forward_tile_shape(int(p.head_dim_qk), int(p.head_dim_v), false, false);
  FlashForwardPlan plan = plan_flash_forward(p, shape, stream, FlashForwardPlanUse::kBackward);
  FlashBackwardParams bp;
  bp.fwd = plan.params;
  bp.d_o = p.d_o.data;
  copy_strides(p.do_rows, bp.do_batch_stride, bp.do_row_stride, bp.do_head_stride);
  bp.dq = p.dq.data;
  copy_strides(p.dq_rows, bp.dq_batch_stride, bp.dq_row_stride, bp.dq_head_stride);
  bp.dk = p.dk.data;
  copy_strides(p.dk_rows, bp.dk_batch_stride, bp.dk_row_stride, bp.dk_head_stride);
  bp.dv = p.dv.data;
  copy_strides(p.dv_rows, bp.dv_batch_stride, bp.dv_row_stride, bp.dv_head_stride);
  bp.scale = float(p.scale);
  const FlashBackwardPlan backward = backward_plan(p);
  const FlashBackwardFamily family = backward.family;
  bp.one_kernel = family == FlashBackwardFamily::kOneKernel;
  bp.query_tile_rows = backward.query_tile_rows;
  plan_query_tile_maps(p, bp);

  const FlashBackwardBuffers sizes = flash_backward_buffers(p, family);
  DeviceBuffer dq_accum(sizes.dq_accum, stream);
  // Zeroed by the backward's prepare kernel (flash_backward_rows.cuh), which reads each row's o
  // and dO anyway, unless the tiles take tickets.
  if (bp.one_kernel) bp.dq_accum = dq_accum.get<float>();
  DeviceBuffer dq_tickets(sizes.dq_tickets, stream);
  bp.dq_tiles_per_head = int(dq_tiles_per_head(p));  // for the tickets or the order flags
  if (sizes.dq_tickets > 0) {
    bp.dq_tickets = dq_tickets.get<int>();
    DPA_CUDA_CHECK(cudaMemsetAsync(bp.dq_tickets, 0, dq_tickets.bytes(), stream));
  }
  DeviceBuffer dq_order(sizes.dq_order, stream);
  if (sizes.dq_order > 0) {
    bp.dq_order = dq_order.get<int>();
    const int64_t key_block_rows =
        flash_backward_one_kernel_block_n(int(p.head_dim_qk), int(p.head_dim_v));
    bp.key_chain = deterministic_key_chain(
        int(p.batch), int((p.max_seqlen_kv + key_block_rows - 1) / key_block_rows));
    DPA_CUDA_CHECK(cudaMemsetAsync(bp.dq_order, 0, dq_order.bytes(), stream));
  }
  DeviceBuffer row_delta(sizes.row_delta, stream);
  DeviceBuffer row_dalpha(sizes.row_dalpha, stream);
  bp.row_delta = row_delta.get<float>();
  bp.row_dalpha = p.wants_dsoftmax_offset ? row_dalpha.get<float>() : nullptr;

  // Rows outside every sequence get zero gradients; the kernels write every real row.
  if (has_rows_outside_sequences(p, true))
    zero_stored_rows(p, p.dq, p.dq_rows, true, p.heads_q, p.head_dim_qk, stream);
  if (has_rows_outside_sequences(p, false)) {
    zero_stored_rows(p, p.dk, p.dk_rows, false, p.heads_kv, p.head_dim_qk, stream);
    zero_stored_rows(p, p.dv, p.dv_rows, false, p.heads_kv, p.head_dim_v, stream);
  }
  launch_flash_backward(bp, p.dtype, int(p.head_dim_qk), int(p.head_dim_v), stream);
  if (p.wants_dsoftmax_offset)
    launch_reduce_dalpha(row_dalpha.get<float>(), p.batch, p.heads_q, p.max_seqlen_q,
                         static_cast<float*>(p.dsoftmax_offset.data), stream);
}

}  // namespace dpa::cuda
