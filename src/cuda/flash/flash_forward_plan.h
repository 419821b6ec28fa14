// Turns a validated AttentionProblem into everything a flash forward launch needs: kernel
// parameters, device sequence tables and the split-KV workspace.
#pragma once

#include <cuda_runtime_api.h>

#include "core/problem.h"
#include "cuda/device_buffer.h"
#include "cuda/flash/flash_params.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/sequence_tables.h"
#include "cuda/tensor_map.h"

namespace dpa::cuda {

struct FlashForwardPlan {
  FlashForwardParams params;
  SequenceTables tables;      // params point into these
  DeviceBuffer partials;      // split-KV partial o / lse, when params.num_splits > 1
  DeviceBuffer tile_counter;  // params.tile_counter's int, when the grid schedules dynamically
};

// A tensor's batch, row and head strides (elements) into kernel parameters.
void copy_strides(const RowLayout& layout, int64_t& batch_stride, int64_t& row_stride,
                  int64_t& head_stride);

// A [batch, rows, heads, dim] view of a q/k/v-like tensor, for its tensor map.
RowTensor row_tensor(const TensorView& view, const RowLayout& layout, DType dtype, int64_t batch,
                     int64_t rows, int64_t heads, int64_t dim);

// Encodes the warp-specialised forward's tensor maps of q, k and v (boxes of q_box_rows and
// kv_box_rows rows) into `params` and sets params.tma, with tma_tails = `tails` (some sequence
// ends inside its tensor), where TMA can address all three; otherwise leaves `params` to
// cp.async. Shared by plan_flash_forward and the KV cache's prefill on the flash forward.
void plan_forward_tensor_maps(const RowTensor& q, const RowTensor& k, const RowTensor& v,
                              int q_box_rows, int kv_box_rows, bool tails,
                              FlashForwardParams& params);

// Whether the forward may run softcap with a fixed max (FlashForwardParams::softcap_fixed_max):
// P = exp2(s - m) with m = c' - 20 (c' = softcap * log2 e) must stay within bf16's and fp32's
// normal range for every visible key, which holds for a bf16 P (fp16's 5-bit exponent overflows
// at 2^16), without ALiBi (it lowers whole rows below -c') and with c' <= 72.5 (softcap up to
// 50.25: Gemma 2's 50 and Grok's 30 qualify).
bool softcap_fixed_max_applies(double softcap, DType dtype, bool alibi);

// The online max's slack (FlashForwardParams::max_slack): 8, or for fp16 with dropout at most
// what keeps P / keep_prob <= 2^(slack + 1) under fp16's largest value (0: P <= 1, as without
// the slack, for keep_prob below 2^-15).
float forward_max_slack(DType dtype, double keep_prob);

// Whom the forward's parameters are for: the forward's launch, or the backward's kernels, which
// take the features and sequence tables but walk every tile themselves and copy their own tiles
// (one split; no forward tensor maps or persistent grid).
enum class FlashForwardPlanUse { kForwardLaunch, kBackward };

// `shape` is the tile shape the forward launch will use (it decides the split count).
FlashForwardPlan plan_flash_forward(const AttentionProblem& problem, const FlashTileShape& shape,
                                    cudaStream_t stream,
                                    FlashForwardPlanUse use = FlashForwardPlanUse::kForwardLaunch);

// The split-KV count the forward launches with `shape`, and the bytes of its partials.
int flash_forward_num_splits(const AttentionProblem& problem, const FlashTileShape& shape);
size_t flash_forward_partials_bytes(const AttentionProblem& problem, int num_splits);

// Whether a forward's blocks of work visit about as many key tiles each: no mask and no window,
// or a window bounded on both sides (a causal mask's right bound is 0). A persistent grid then
// takes them by a static stride; otherwise (causal, a window bounded on one side) by the dynamic
// scheduler's counter. The plan (on its bounds) and explain() (on the request) both ask it.
constexpr bool flash_forward_blocks_alike(bool left_bounded, bool right_bounded) {
  return left_bounded == right_bounded;
}

// Whether a forward may run on a persistent grid: the warp-specialised form with one split (a
// split launch has about one block of work per SM already, so it gains nothing from looping).
// plan_flash_forward also needs the tensor maps (its TMA producer one thread), which the
// workspace's size cannot see.
constexpr bool flash_forward_may_persist(const FlashTileShape& shape, int num_splits) {
  return shape.warp_specialized && num_splits == 1;
}

// The dynamic scheduler's counter (FlashForwardParams::tile_counter): counted wherever the plan
// may take it (flash_forward_may_persist).
size_t flash_forward_tile_counter_bytes(const FlashTileShape& shape, int num_splits);

// The library's tile shape for a problem: decode tiles for at most kFlashDecodeMaxQueries rows,
// the wgmma forms on compute capability 9.0 (`arch` 90); `window_span` (AttentionProblem::
// window_span) may narrow the warp-specialised block; it, `dropout` and `group_size` (query
// heads per KV head) may change that form's key tile (flash_forward_wgmma_ws_block_n) and pack
// the query heads of a KV head into its blocks (flash_forward_packs_gqa).
FlashTileShape flash_forward_shape(int64_t head_dim_qk, int64_t head_dim_v, int64_t max_seqlen_q,
                                   int64_t window_span, int arch, FlashForwardKernel kernel,
                                   bool dropout, int64_t group_size);
FlashTileShape flash_forward_shape_for(const AttentionProblem& problem);

}  // namespace dpa::cuda
