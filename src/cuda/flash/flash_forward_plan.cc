#include "cuda/flash/flash_forward_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/runtime.h"
#include "cuda/tensor_map.h"

namespace dpa::cuda {
namespace {

constexpr double kLog2e = 1.4426950408889634;

// The [batch, rows, heads, dim] view of q, k or v that the forward's tensor map addresses: a
// packed (thd) tensor as one batch of all its rows.
RowTensor forward_row_tensor(const AttentionProblem& p, const TensorView& view,
                             const RowLayout& layout, bool queries, int64_t heads, int64_t dim) {
  if (p.format != Format::kTHD)
    return row_tensor(view, layout, p.dtype, p.batch, queries ? p.max_seqlen_q : p.max_seqlen_kv,
                      heads, dim);
  const int64_t rows = queries ? p.total_q : p.total_kv;
  RowTensor t = row_tensor(view, layout, p.dtype, 1, rows, heads, dim);
  t.batch_stride = rows * t.row_stride;  // one batch: any stride the encoder takes
  return t;
}

// TMA copies for the warp-specialised kernel (FlashForwardParams::tma) where the maps can
// address the tensors. Where some sequence ends inside its tensor (padding, thd), the key tiles
// that cross its end come by cp.async (tma_tails). Q's rows past a sequence are never stored.
void plan_tensor_maps(const AttentionProblem& p, const FlashTileShape& shape,
                      FlashForwardParams& params) {
  if (!shape.warp_specialized) return;
  const RowTensor q = forward_row_tensor(p, p.q, p.q_rows, true, p.heads_q, p.head_dim_qk);
  const RowTensor k = forward_row_tensor(p, p.k, p.k_rows, false, p.heads_kv, p.head_dim_qk);
  const RowTensor v = forward_row_tensor(p, p.v, p.v_rows, false, p.heads_kv, p.head_dim_v);
  plan_forward_tensor_maps(q, k, v, shape.block_m, shape.block_n, !p.keys_fill_rows(), params);
}

}  // namespace

RowTensor row_tensor(const TensorView& view, const RowLayout& layout, DType dtype, int64_t batch,
                     int64_t rows, int64_t heads, int64_t dim) {
  RowTensor t;
  t.base = view.data;
  t.dtype = dtype;
  t.batch = batch;
  t.rows = rows;
  t.heads = heads;
  t.dim = dim;
  t.batch_stride = layout.stride_batch;
  t.row_stride = layout.stride_seq;
  t.head_stride = layout.stride_head;
  return t;
}

void plan_forward_tensor_maps(const RowTensor& q, const RowTensor& k, const RowTensor& v,
                              int q_box_rows, int kv_box_rows, bool tails,
                              FlashForwardParams& params) {
  if (!tensor_map_can_address(q) || !tensor_map_can_address(k) || !tensor_map_can_address(v))
    return;
  const std::optional<CUtensorMap> q_map = encode_row_tensor_map(q, q_box_rows);
  const std::optional<CUtensorMap> k_map = encode_row_tensor_map(k, kv_box_rows);
  const std::optional<CUtensorMap> v_map = encode_row_tensor_map(v, kv_box_rows);
  if (!q_map || !k_map || !v_map) return;  // cp.async copies instead
  params.q_map = *q_map;
  params.k_map = *k_map;
  params.v_map = *v_map;
  params.tma = true;
  params.tma_tails = tails;
}

bool softcap_fixed_max_applies(double softcap, DType dtype, bool alibi) {
  constexpr double kLargestCapLog2 = 72.5;  // 2^(-2c' + 20) >= 2^-125
  return softcap > 0 && softcap * kLog2e <= kLargestCapLog2 && dtype == DType::kBFloat16 && !alibi;
}

float forward_max_slack(DType dtype, double keep_prob) {
  constexpr double kSlack = 8.0, kLargestHalf = 65504.0;
  if (dtype != DType::kFloat16 || keep_prob >= 1.0) return float(kSlack);
  const double room = std::floor(std::log2(kLargestHalf * keep_prob)) - 1.0;
  return float(std::clamp(room, 0.0, kSlack));
}

void copy_strides(const RowLayout& layout, int64_t& batch_stride, int64_t& row_stride,
                  int64_t& head_stride) {
  batch_stride = layout.stride_batch;
  row_stride = layout.stride_seq;
  head_stride = layout.stride_head;
}

FlashForwardPlan plan_flash_forward(const AttentionProblem& p, const FlashTileShape& shape,
                                    cudaStream_t stream, FlashForwardPlanUse use) {
  FlashForwardPlan plan;
  plan.tables = upload_sequence_tables(p, stream);
  FlashForwardParams& params = plan.params;
  params.q = p.q.data;
  params.k = p.k.data;
  params.v = p.v.data;
  params.o = p.o.data;
  params.lse = static_cast<float*>(p.lse.data);
  copy_strides(p.q_rows, params.q_batch_stride, params.q_row_stride, params.q_head_stride);
  copy_strides(p.k_rows, params.k_batch_stride, params.k_row_stride, params.k_head_stride);
  copy_strides(p.v_rows, params.v_batch_stride, params.v_row_stride, params.v_head_stride);
  copy_strides(p.o_rows, params.o_batch_stride, params.o_row_stride, params.o_head_stride);
  const bool thd = p.format == Format::kTHD;
  params.lse_batch_stride = thd ? 0 : p.heads_q * p.max_seqlen_q;
  params.lse_head_stride = thd ? p.total_q : p.max_seqlen_q;
  params.seqlen_q = plan.tables.seqlen_q;
  params.seqlen_kv = plan.tables.seqlen_kv;
  params.start_q = thd ? plan.tables.start_q : nullptr;
  params.start_kv = thd ? plan.tables.start_kv : nullptr;
  params.batch = int(p.batch);
  params.heads_q = int(p.heads_q);
  params.heads_kv = int(p.heads_kv);
  params.group_size = int(p.group_size());
  params.max_seqlen_q = int(p.max_seqlen_q);
  params.max_seqlen_kv = int(p.max_seqlen_kv);
  params.scale_log2 = float(p.scale * kLog2e);
  params.use_softcap = p.softcap > 0;
  if (params.use_softcap) {
    params.softcap_arg_scale = float(p.scale / p.softcap);
    params.softcap_log2 = float(p.softcap * kLog2e);
    params.softcap_fixed_max = softcap_fixed_max_applies(p.softcap, p.dtype, p.has_alibi);
  }
  // A window at least as long as any distance between a query and a key (diagonal included)
  // is unbounded; passing it as -1 keeps the kernels' int arithmetic (center +- window) from
  // overflowing for huge windows such as INT_MAX.
  int64_t reach = p.max_seqlen_q + p.max_seqlen_kv;
  for (int64_t b = 0; b < p.batch; ++b)
    reach = std::max(reach, p.max_seqlen_q + p.max_seqlen_kv + std::abs(p.diagonal_offset(b)));
  auto window = [&](int64_t bound) { return bound < 0 || bound >= reach ? -1 : int(bound); };
  params.window_left = window(p.window_left);
  params.window_right = window(p.window_right);
  params.diagonal = plan.tables.diagonal;
  params.q_position = plan.tables.q_position;
  params.kv_position = plan.tables.kv_position;
  params.head_offset = int(p.cp.head_offset);
  params.heads_total = int(p.global_heads());
  params.exclude_sink = p.cp.exclude_sink;
  if (p.has_alibi) {
    params.alibi_slopes = static_cast<const float*>(p.alibi_slopes.data);
    params.alibi_batch_stride = int(p.alibi_stride_batch);
  }
  params.softmax_type = int(p.softmax_type);
  params.softmax_offset = static_cast<const float*>(p.softmax_offset.data);
  params.dropout_threshold = p.dropout_threshold;
  params.max_slack = forward_max_slack(p.dtype, p.keep_prob);
  params.dropout_scale = float(1.0 / p.keep_prob);
  params.seed = p.rng.seed;
  params.dropout_round_keys = philox_round_keys(uint32_t(p.rng.seed), uint32_t(p.rng.seed >> 32));
  params.offset = p.rng.offset;

  const int64_t kv_blocks = (p.max_seqlen_kv + shape.block_n - 1) / shape.block_n;
  params.wgmma = shape.wgmma;
  params.warp_specialized = shape.warp_specialized;
  params.consumer_warpgroups = shape.block_m / 64;
  params.block_n = shape.block_n;
  params.decode = shape.warps == 1;
  if (use == FlashForwardPlanUse::kBackward) return plan;
  plan_tensor_maps(p, shape, params);
  params.num_splits = flash_forward_num_splits(p, shape);
  // GQA packing (flash_forward_packs_gqa) where the kernel takes it: Q by TMA over whole
  // sequences (one box spans the packed heads), one split. Otherwise the packed shape's tile
  // runs one head per block.
  if (shape.packed_heads > 1 && params.tma && !params.tma_tails && params.num_splits == 1) {
    const RowTensor q = forward_row_tensor(p, p.q, p.q_rows, true, p.heads_q, p.head_dim_qk);
    const std::optional<CUtensorMap> q_map =
        encode_row_tensor_map(q, shape.block_m / shape.packed_heads, shape.packed_heads);
    if (q_map) {
      params.q_map = *q_map;
      params.packed_heads = shape.packed_heads;
    }
  }
  // A persistent grid of one block per SM (the kernel keeps one block per SM anyway) where it may
  // persist and the TMA producer is one thread (full-length sequences: no tails).
  const bool persistent =
      flash_forward_may_persist(shape, params.num_splits) && params.tma && !params.tma_tails;
  if (persistent && flash_forward_blocks_alike(params.window_left >= 0, params.window_right >= 0)) {
    // Blocks of work that visit about as many key tiles each: a static stride balances them.
    params.persistent_blocks = device_info(p.device_index).sm_count;
  } else if (persistent && params.block_table == nullptr) {
    // Blocks of work of different lengths (causal, a window bounded on one side), which a static
    // stride balanced worse than the hardware's block scheduler (d = 128 causal sink 564 against
    // 589 TFLOP/s, docs/perf.md, session 13): a counter hands them out, longest first (FA3's
    // dynamic scheduler), and a block loads its next Q and tiles under the current one. Not
    // with pages, whose producer is more than one thread.
    plan.tile_counter = DeviceBuffer(sizeof(int), stream);
    DPA_CUDA_CHECK(cudaMemsetAsync(plan.tile_counter.get(), 0, sizeof(int), stream));
    params.tile_counter = plan.tile_counter.get<int>();
    params.persistent_blocks = device_info(p.device_index).sm_count;
  }
  if (params.num_splits > 1) {
    params.blocks_per_split = int((kv_blocks + params.num_splits - 1) / params.num_splits);
    const int64_t rows = int64_t(params.num_splits) * p.batch * p.heads_q * p.max_seqlen_q;
    plan.partials = DeviceBuffer(flash_forward_partials_bytes(p, params.num_splits), stream);
    // o first: its float2 stores stay 8-byte aligned (and the merge's float4 loads 16-byte
    // aligned) whatever the row count.
    params.partial_o = plan.partials.get<float>();
    params.partial_lse = params.partial_o + rows * p.head_dim_v;
  }
  return plan;
}

int flash_forward_num_splits(const AttentionProblem& p, const FlashTileShape& shape) {
  // GQA packing takes one split (its Q map spans whole sequences), and its blocks see a few key
  // tiles each, which splits would share out for nothing: four consumers' 256-row blocks would
  // otherwise split problems of under 132 of them (b 1, 512 positions, 64 heads) and lose it.
  if (shape.packed_heads > 1) return 1;
  const int64_t query_blocks = (p.max_seqlen_q + shape.block_m - 1) / shape.block_m;
  const int64_t kv_blocks = (p.max_seqlen_kv + shape.block_n - 1) / shape.block_n;
  return choose_num_splits(p.batch, p.heads_q, query_blocks, kv_blocks,
                           device_info(p.device_index).sm_count, shape.blocks_per_sm);
}

size_t flash_forward_tile_counter_bytes(const FlashTileShape& shape, int num_splits) {
  return flash_forward_may_persist(shape, num_splits) ? sizeof(int) : 0;
}

size_t flash_forward_partials_bytes(const AttentionProblem& p, int num_splits) {
  if (num_splits <= 1) return 0;
  const int64_t rows = int64_t(num_splits) * p.batch * p.heads_q * p.max_seqlen_q;
  return size_t(rows) * size_t(p.head_dim_v + 1) * sizeof(float);  // o, then lse
}

FlashTileShape flash_forward_shape(int64_t head_dim_qk, int64_t head_dim_v, int64_t max_seqlen_q,
                                   int64_t window_span, int arch, FlashForwardKernel kernel,
                                   bool dropout, int64_t group_size) {
  // sm_90a code runs on compute capability 9.0 only (the build targets sm_80 and sm_90a).
  // On Hopper the warp-specialised wgmma kernel at every head dim it has (it measured faster
  // than the plain two-warpgroup form everywhere, which session 32 removed: docs/cuda_flash.md);
  // the config's kernel family (tests, benches) can ask for the mma.sync family instead. The
  // window and dropout may change the warp-specialised form's tile
  // (flash_forward_wgmma_ws_tile_shape).
  const bool hopper = arch == 90 && kernel != FlashForwardKernel::kMmaSync;
  FlashTileShape shape = flash_forward_tile_shape(int(head_dim_qk), int(head_dim_v),
                                                  max_seqlen_q <= kFlashDecodeMaxQueries, hopper);
  if (shape.wgmma)
    shape = flash_forward_wgmma_ws_tile_shape(int(head_dim_qk), int(head_dim_v), window_span,
                                              dropout, group_size);
  return shape;
}

FlashTileShape flash_forward_shape_for(const AttentionProblem& p) {
  return flash_forward_shape(
      p.head_dim_qk, p.head_dim_v, p.max_seqlen_q, p.window_span(),
      device_info(p.device_index).arch, p.flash_forward_kernel, p.dropout_threshold != 0,
      flash_forward_packable_group(p.heads_q, p.heads_kv, p.format == Format::kTHD,
                                   p.keys_fill_rows()));
}

}  // namespace dpa::cuda
