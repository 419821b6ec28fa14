#include "cuda/kvcache/kvcache_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "core/kvcache_splits.h"
#include "core/problem.h"
#include "core/workspace.h"
#include "cuda/device_buffer.h"
#include "cuda/fill_rows.h"
#include "cuda/flash/flash_forward_launch.h"
#include "cuda/flash/flash_forward_plan.h"
#include "cuda/flash/flash_tiles.h"
#include "cuda/kvcache/kvcache_launch.h"
#include "cuda/runtime.h"
#include "cuda/tensor_map.h"

namespace dpa::cuda {
namespace {

constexpr double kLog2e = 1.4426950408889634;
constexpr int64_t kRowsPerBlock = 16;  // packed rows per attention block (kvcache_kernels.cuh)

// A window bound at least as long as any query-key distance is unbounded (-1), which keeps the
// kernel's int arithmetic (position +- window) from overflowing.
int window_bound(int64_t bound, int64_t reach) {
  return bound < 0 || bound >= reach ? -1 : int(bound);
}

// Element strides of a [b, rows, heads, d] tensor, or of a packed [rows, heads, d] one (batch
// stride 0: its rows are addressed by the packed row).
void row_strides(const TensorView& t, bool packed, int64_t& batch, int64_t& row, int64_t& head) {
  const size_t rows = packed ? 0 : 1;
  batch = packed ? 0 : t.strides[0];
  row = t.strides[rows];
  head = t.strides[rows + 1];
}

// The kernels' parameters and grid for a call: shared by the run and the workspace query, so
// that both count the same partials.
struct KvCacheLaunch {
  KvCacheParams params;
  int64_t row_blocks = 1;
  int stages = 0;       // the attention kernel's pipeline stages (kvcache_launch.h)
  int64_t queries = 0;  // q's rows per sequence (4-D) or in all (packed)
  int64_t max_new = 0;  // k_new's rows per sequence (4-D) or in all (packed)
};

KvCacheLaunch plan_launch(const KvCachePlan& plan, const KvCacheConfig& config,
                          const KvCacheArgs& a) {
  KvCacheLaunch launch;
  KvCacheParams& p = launch.params;
  const int head_dim = int(plan.head_dim_qk);

  p.q = a.q.data;
  p.o = a.o.data;
  p.lse = static_cast<float*>(a.lse.data);
  const int q_rows = plan.packed_q ? 0 : 1;  // the row dimension of q / o, after the batch
  row_strides(a.q, plan.packed_q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
  row_strides(a.o, plan.packed_q, p.o_batch_stride, p.o_row_stride, p.o_head_stride);
  const int64_t queries = launch.queries =
      a.q.shape[size_t(q_rows)];  // per sequence (4-D) or in all (packed)
  if (a.lse.defined()) {          // contiguous [b, H, sq] or [H, tq]
    p.lse_batch_stride = plan.packed_q ? 0 : plan.heads_q * queries;
    p.lse_head_stride = queries;
  }
  p.cu_seqlens_q = static_cast<const int*>(a.cu_seqlens_q.data);
  p.queries_per_sequence = plan.packed_q ? 0 : int(queries);

  p.k_cache = a.k_cache.data;
  p.v_cache = a.v_cache.data;
  p.k_dim0_stride = a.k_cache.strides[0];
  p.k_row_stride = a.k_cache.strides[1];
  p.k_head_stride = a.k_cache.strides[2];
  p.v_dim0_stride = a.v_cache.strides[0];
  p.v_row_stride = a.v_cache.strides[1];
  p.v_head_stride = a.v_cache.strides[2];
  if (plan.paged) {
    p.block_table = static_cast<const int*>(a.block_table.data);
    p.block_table_stride = a.block_table.strides[0];
    p.page_shift = int(std::log2(double(plan.page_size)) + 0.5);
  }
  p.cache_seqlens = static_cast<const int*>(a.cache_seqlens.data);
  if (plan.uniform_cached >= 0) p.cache_length = int(plan.uniform_cached);

  if (a.k_new.defined()) {
    p.k_new = a.k_new.data;
    p.v_new = a.v_new.data;
    const int rows = plan.packed_new ? 0 : 1;
    row_strides(a.k_new, plan.packed_new, p.k_new_batch_stride, p.k_new_row_stride,
                p.k_new_head_stride);
    row_strides(a.v_new, plan.packed_new, p.v_new_batch_stride, p.v_new_row_stride,
                p.v_new_head_stride);
    p.cu_seqlens_k_new = static_cast<const int*>(a.cu_seqlens_k_new.data);
    launch.max_new = a.k_new.shape[size_t(rows)];
    p.new_per_sequence = plan.packed_new ? 0 : int(launch.max_new);
  }

  p.batch = int(plan.batch);
  p.heads_q = int(plan.heads_q);
  p.heads_kv = int(plan.heads_kv);
  p.group = int(plan.heads_q / plan.heads_kv);
  p.by_group = FastDivider(p.group);
  const double scale = config.scale ? *config.scale : 1.0 / std::sqrt(double(head_dim));
  p.scale_log2 = float(scale * kLog2e);
  p.use_softcap = config.softcap > 0;
  if (p.use_softcap) {
    p.softcap_arg_scale = float(scale / config.softcap);
    p.softcap_log2 = float(config.softcap * kLog2e);
  }
  const int64_t reach = plan.capacity + queries + 1;
  p.window_left = window_bound(config.window_left, reach);
  p.window_right = window_bound(config.causal ? 0 : config.window_right, reach);
  if (a.alibi_slopes.defined()) {
    p.alibi_slopes = static_cast<const float*>(a.alibi_slopes.data);
    p.alibi_batch_stride = a.alibi_slopes.ndim == 2 ? p.heads_q : 0;
  }
  p.softmax_type = int(config.softmax_type);
  p.softmax_offset = static_cast<const float*>(a.softmax_offset.data);

  // Blocks: sequences x KV heads x row blocks (capped: they stride over their rows), split
  // until the device is full.
  const int64_t packed_rows = queries * p.group;
  const DeviceInfo& device = device_info(a.q.device_index);
  launch.stages = kvcache_default_stages(head_dim);
  int64_t slots = int64_t(device.sm_count) * kvcache_blocks_per_sm(head_dim, launch.stages);
  const int64_t sequence_heads = plan.batch * plan.heads_kv;
  const int64_t row_blocks = launch.row_blocks = std::clamp<int64_t>(
      std::min((packed_rows + kRowsPerBlock - 1) / kRowsPerBlock,
               (4 * slots + sequence_heads - 1) / std::max<int64_t>(sequence_heads, 1)),
      1, 65535);
  const int64_t key_tiles = kvcache_key_tiles(plan.capacity, p.window_left, p.window_right,
                                              std::min<int64_t>(queries, kRowsPerBlock));
  const int64_t blocks = sequence_heads * row_blocks;
  p.num_splits = kvcache_num_splits(blocks, key_tiles, slots);
  // The deeper pipeline where each split has few tiles, or where it holds each block's whole
  // key range and its blocks still fit on the device at once, if its shared memory fits (its
  // occupancy is asked only then).
  const int deep = kvcache_split_stages(head_dim);
  if (deep != launch.stages &&
      size_t(kvcache_shared_bytes(head_dim, deep)) <= device.shared_memory_per_block_optin) {
    const int64_t deep_slots = int64_t(device.sm_count) * kvcache_blocks_per_sm(head_dim, deep);
    if (kvcache_deep_pipeline(key_tiles, p.num_splits) ||
        kvcache_whole_range_in_flight(key_tiles, p.num_splits, deep, blocks, deep_slots)) {
      launch.stages = deep;
      slots = deep_slots;
      p.num_splits = kvcache_num_splits(blocks, key_tiles, slots);
    }
  }
  p.total_rows = plan.packed_q ? queries : plan.batch * queries;
  return launch;
}

// The split partials' bytes: o [splits, rows, H, dv] first (its float2 stores stay 8-byte
// aligned whatever the row count), then the LSE [splits, rows, H].
// A packed q may hold rows past its last sequence (cu_seqlens_q ends before q does), which no
// kernel of the call writes; the rule for every call (docs/decisions.md) is o = 0 and the empty
// row's LSE there. The tables are not read on the device, so every row is filled first, by the
// fill kernels of the ordinary calls, and the attention then writes the real ones.
void fill_rows_of_a_packed_q(const KvCachePlan& plan, const KvCacheConfig& config,
                             const KvCacheArgs& a, cudaStream_t stream) {
  AttentionProblem rows;
  rows.format = Format::kTHD;
  rows.batch = 1;
  rows.total_q = a.q.shape[0];
  rows.heads_q = plan.heads_q;
  rows.head_dim_v = plan.head_dim_v;
  rows.o = a.o;
  rows.o_rows.stride_seq = a.o.strides[0];
  rows.o_rows.stride_head = a.o.strides[1];
  if (!a.lse.defined()) {
    zero_stored_rows(rows, rows.o, rows.o_rows, true, rows.heads_q, rows.head_dim_v, stream);
    return;
  }
  rows.lse = a.lse;  // contiguous [H, tq]: the fill's layout
  rows.softmax_type = config.softmax_type;
  rows.softmax_offset = a.softmax_offset;
  fill_empty_forward_rows(rows, stream);
}

// Whether the call's attention runs on cuda_flash's forward (core/kvcache_splits.h).
bool prefill_on_flash(const KvCachePlan& plan, const KvCacheLaunch& launch, int device_index) {
  return kvcache_prefill_on_flash(device_info(device_index).arch, plan.packed_q, launch.queries,
                                  plan.head_dim_qk) &&
         plan.head_dim_qk == plan.head_dim_v &&
         flash_forward_has_head_dims(plan.head_dim_qk, plan.head_dim_v);  // minimal builds
}

// Device scratch of the flash route: the sequence tables (3 * b ints) and, when the caller
// wants no LSE, one for the kernel to write ([b, H, sq] floats).
size_t flash_tables_bytes(const KvCachePlan& plan) { return size_t(3 * plan.batch) * sizeof(int); }
size_t flash_lse_bytes(const KvCachePlan& plan, const KvCacheLaunch& launch, const KvCacheArgs& a) {
  return a.lse.defined() ? 0 : size_t(plan.batch * plan.heads_q * launch.queries) * sizeof(float);
}

// The warp-specialised flash forward's tiles for a prefill chunk with `f`'s window.
FlashTileShape prefill_tile_shape(const KvCachePlan& plan, const FlashForwardParams& f) {
  return flash_forward_wgmma_ws_tile_shape(int(plan.head_dim_qk), int(plan.head_dim_v),
                                           window_span(f.window_left, f.window_right));
}

// The flash forward's parameters for the call: q, o and the LSE as the KV-cache kernel
// addresses them, the cache as K and V (pages through the producer), the bottom-right
// diagonal of each sequence from `tables` (launch_kvcache_flash_tables), a persistent grid.
FlashForwardParams flash_prefill_params(const KvCachePlan& plan, const KvCacheLaunch& launch,
                                        const int* tables, float* lse, int device_index) {
  const KvCacheParams& k = launch.params;
  FlashForwardParams f;
  f.q = k.q;
  f.k = k.k_cache;
  f.v = k.v_cache;
  f.o = k.o;
  f.lse = lse;
  f.q_batch_stride = k.q_batch_stride;
  f.q_row_stride = k.q_row_stride;
  f.q_head_stride = k.q_head_stride;
  f.k_batch_stride = k.k_dim0_stride;  // batch or page
  f.k_row_stride = k.k_row_stride;
  f.k_head_stride = k.k_head_stride;
  f.v_batch_stride = k.v_dim0_stride;
  f.v_row_stride = k.v_row_stride;
  f.v_head_stride = k.v_head_stride;
  f.o_batch_stride = k.o_batch_stride;
  f.o_row_stride = k.o_row_stride;
  f.o_head_stride = k.o_head_stride;
  f.lse_batch_stride = plan.heads_q * launch.queries;  // [b, H, sq], the caller's or scratch
  f.lse_head_stride = launch.queries;
  f.seqlen_q = tables;
  f.seqlen_kv = tables + plan.batch;
  f.diagonal = tables + 2 * plan.batch;
  f.batch = k.batch;
  f.heads_q = k.heads_q;
  f.heads_kv = k.heads_kv;
  f.group_size = k.group;
  f.max_seqlen_q = int(launch.queries);
  f.max_seqlen_kv = int(plan.capacity);
  f.scale_log2 = k.scale_log2;
  f.softcap_arg_scale = k.softcap_arg_scale;
  f.softcap_log2 = k.softcap_log2;
  f.use_softcap = k.use_softcap;
  f.window_left = k.window_left;
  f.window_right = k.window_right;
  f.heads_total = k.heads_q;
  f.alibi_slopes = k.alibi_slopes;
  f.alibi_batch_stride = k.alibi_batch_stride;
  f.softmax_type = k.softmax_type;
  f.softmax_offset = k.softmax_offset;
  f.wgmma = true;
  f.warp_specialized = true;
  const FlashTileShape shape = prefill_tile_shape(plan, f);
  f.consumer_warpgroups = shape.block_m / 64;
  f.block_n = shape.block_n;
  f.persistent_blocks = device_info(device_index).sm_count;
  f.block_table = k.block_table;
  f.block_table_stride = k.block_table_stride;
  f.page_shift = k.page_shift;
  return f;
}

// The caches as TMA sees them, [dim0, rows, G, d]: dim 0 is the batch (contiguous) or the page
// (paged), dim 1 the rows of either.
struct CacheRowTensors {
  RowTensor k, v;
};

CacheRowTensors cache_row_tensors(const KvCachePlan& plan, const KvCacheArgs& a,
                                  const KvCacheParams& p) {
  const int64_t dim0 = a.k_cache.shape[0], rows = a.k_cache.shape[1];
  return {{p.k_cache, a.q.dtype, dim0, rows, plan.heads_kv, plan.head_dim_qk, p.k_dim0_stride,
           p.k_row_stride, p.k_head_stride},
          {p.v_cache, a.q.dtype, dim0, rows, plan.heads_kv, plan.head_dim_v, p.v_dim0_stride,
           p.v_row_stride, p.v_head_stride}};
}

// The rows of a TMA box over the cache for key tiles of `tile_rows`: the tile's, or a page's
// where pages are shorter (a box never crosses a page); 0 for pages of fewer than 8 rows, which
// keep cp.async for every tile: their boxes would be shorter than the 128-byte swizzle's 8-row
// period, and a tile would take 16 or more boxes per 64 columns.
int cache_box_rows(const KvCachePlan& plan, int tile_rows) {
  if (!plan.paged) return tile_rows;
  return plan.page_size < 8 ? 0 : int(std::min<int64_t>(plan.page_size, tile_rows));
}

// TMA copies for a prefill chunk on the flash forward (FlashForwardParams::tma): q as
// [b, sq, H, d], the cache as cache_row_tensors. The key tiles that cross a sequence's end come
// by cp.async (tma_tails): the cache's rows past a sequence are stale, not zeros.
void plan_prefill_tensor_maps(const KvCachePlan& plan, const KvCacheArgs& a, const KvCacheParams& p,
                              int64_t queries, FlashForwardParams& f) {
  const FlashTileShape shape = prefill_tile_shape(plan, f);
  const int box_rows = cache_box_rows(plan, shape.block_n);
  if (box_rows == 0) return;
  const RowTensor q{f.q,
                    a.q.dtype,
                    plan.batch,
                    queries,
                    plan.heads_q,
                    plan.head_dim_qk,
                    f.q_batch_stride,
                    f.q_row_stride,
                    f.q_head_stride};
  const CacheRowTensors cache = cache_row_tensors(plan, a, p);
  plan_forward_tensor_maps(q, cache.k, cache.v, shape.block_m, box_rows, /*tails=*/true, f);
}

// TMA copies of the KV-cache kernel's key tiles (KvCacheParams::tma) on sm_90, boxes of
// cache_box_rows(plan, 64) rows by 64 columns; cp.async where those are 0 or TMA cannot address
// the cache.
void plan_kvcache_tensor_maps(const KvCachePlan& plan, const KvCacheArgs& a, KvCacheParams& p) {
  const int box_rows = cache_box_rows(plan, int(kKvCacheTileKeys));
  if (device_info(a.q.device_index).arch < 90 || box_rows == 0) return;
  const CacheRowTensors cache = cache_row_tensors(plan, a, p);
  if (!tensor_map_can_address(cache.k) || !tensor_map_can_address(cache.v)) return;
  const std::optional<CUtensorMap> k_map = encode_row_tensor_map(cache.k, box_rows);
  const std::optional<CUtensorMap> v_map = encode_row_tensor_map(cache.v, box_rows);
  if (!k_map || !v_map) return;
  p.k_map = *k_map;
  p.v_map = *v_map;
  p.tma = true;
}

size_t partials_bytes(const KvCacheLaunch& launch, const KvCachePlan& plan) {
  const KvCacheParams& p = launch.params;
  if (p.num_splits <= 1 || plan.batch == 0 || launch.queries == 0) return 0;
  const size_t rows = size_t(p.num_splits) * size_t(p.total_rows) * size_t(p.heads_q);
  return rows * size_t(plan.head_dim_v + 1) * sizeof(float);
}

}  // namespace

std::optional<std::string> kvcache_device_refusal(const KvCachePlan& plan) {
  const int head_dim = int(plan.head_dim_qk);
  const size_t needed = size_t(kvcache_shared_bytes(head_dim, kvcache_default_stages(head_dim)));
  const size_t available = device_info(plan.device_index).shared_memory_per_block_optin;
  if (needed <= available) return std::nullopt;
  return "has head dim " + std::to_string(plan.head_dim_qk) + ", whose KV-cache kernel needs " +
         std::to_string(needed) + " bytes of shared memory per block; this device allows " +
         std::to_string(available);
}

size_t kvcache_workspace_bytes(const KvCachePlan& plan, const KvCacheConfig& config,
                               const KvCacheArgs& args) {
  const DeviceGuard guard(args.q.device_index);
  const KvCacheLaunch launch = plan_launch(plan, config, args);
  if (plan.batch > 0 && launch.queries > 0 && prefill_on_flash(plan, launch, args.q.device_index))
    return workspace_bytes_for({flash_tables_bytes(plan), flash_lse_bytes(plan, launch, args)});
  const size_t bytes = partials_bytes(launch, plan);
  return bytes == 0 ? 0 : workspace_bytes_for({bytes});
}

void run_kvcache_on_device(const KvCachePlan& plan, const KvCacheConfig& config,
                           const KvCacheArgs& a) {
  const DeviceGuard guard(a.q.device_index);
  const cudaStream_t stream = static_cast<cudaStream_t>(a.stream);
  KvCacheLaunch launch = plan_launch(plan, config, a);
  KvCacheParams& p = launch.params;
  const DType dtype = a.q.dtype;
  const int head_dim = int(plan.head_dim_qk);
  const int64_t queries = launch.queries, max_new = launch.max_new;
  const int64_t row_blocks = launch.row_blocks;

  if (plan.batch == 0) return;  // nothing to append or attend (and no grid of 0 blocks)
  if (p.k_new != nullptr && max_new > 0)
    launch_kvcache_append(p, dtype, head_dim, int(plan.head_dim_v), max_new, stream);
  if (queries == 0) return;
  if (prefill_on_flash(plan, launch, a.q.device_index)) {
    const DeviceBuffer tables(flash_tables_bytes(plan), stream);
    const DeviceBuffer scratch_lse(flash_lse_bytes(plan, launch, a), stream);
    launch_kvcache_flash_tables(p, tables.get<int>(), stream);
    float* lse = a.lse.defined() ? p.lse : scratch_lse.get<float>();
    FlashForwardParams f =
        flash_prefill_params(plan, launch, tables.get<int>(), lse, a.q.device_index);
    plan_prefill_tensor_maps(plan, a, p, queries, f);
    f.softcap_fixed_max =
        softcap_fixed_max_applies(config.softcap, dtype, p.alibi_slopes != nullptr);
    launch_flash_forward(f, dtype, head_dim, int(plan.head_dim_v), stream);
    return;
  }
  if (plan.packed_q) fill_rows_of_a_packed_q(plan, config, a, stream);
  DeviceBuffer partials;
  if (p.num_splits > 1) {
    const size_t rows = size_t(p.num_splits) * size_t(p.total_rows) * size_t(p.heads_q);
    partials = DeviceBuffer(partials_bytes(launch, plan), stream);
    p.partial_o = partials.get<float>();
    p.partial_lse = p.partial_o + rows * size_t(plan.head_dim_v);
  }
  plan_kvcache_tensor_maps(plan, a, p);
  launch_kvcache_attention(p, dtype, head_dim, launch.stages, unsigned(row_blocks), stream);
  if (p.num_splits > 1) {
    const bool programmatic = device_info(a.q.device_index).arch >= 90;
    launch_kvcache_merge(p, dtype, int(plan.head_dim_v), queries, programmatic, stream);
  }
}

}  // namespace dpa::cuda
