// The KV-cache kernels (docs/kvcache.md): the append of new tokens into the cache, split-KV
// attention over the cache with GQA packing, and the LSE merge of the splits.
//
// The attention kernel: a block of four warps owns 16 packed rows (kvcache_params.h) of one
// (sequence, KV head, split), so the H / G query heads of a KV head read each key once. Keys
// stream through shared memory in tiles of 64 (K and V in the 128-byte-swizzled layout of
// swizzled_tile_copies.cuh), copied by TMA boxes on sm_90 or by cp.async, in a multi-stage
// pipeline; warp w takes keys 16w..16w+15 of every
// tile (S = Q K^T, the logit transform and mask, the online softmax and O += P V on mma.sync
// m16n8k16), and the four warps' partial softmax states merge in shared memory at the end. Decode
// is bound by the bytes of K and V, so the tile's rows matter less than keeping enough of them in
// flight, and issuing them cheaply.
#pragma once

#include "core/kvcache_splits.h"
#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/kvcache/kvcache_params.h"
#include "cuda/merge_row.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"
#include "cuda/ptx/mbarrier.cuh"
#include "cuda/ptx/tma.cuh"
#include "cuda/swizzled_tile_copies.cuh"

namespace dpa::cuda {

constexpr int kKvTileKeys = int(kKvCacheTileKeys);  // keys per pipeline stage
constexpr int kKvWarps = 4;                         // each takes 16 keys of a tile
constexpr int kKvThreads = 32 * kKvWarps;
constexpr int kKvRows = 16;  // packed rows per block: one m16 slab

// Stages in flight. Decode keeps up with the memory system only with several tiles loading and
// with enough blocks per SM to hide the latency of each one's math: at d = 128 two stages (three
// blocks per SM) beat three (two blocks per SM) by 1-5% on the H200 and four (one block) lose
// half (docs/perf.md, session 11).
constexpr int kv_default_stages(int head_dim) { return head_dim <= 64 ? 4 : 2; }
// When the keys are split, each block has few tiles and the first ones' latency weighs more: at
// d = 128 three stages (two blocks per SM) measured 4-8% faster than two at b = 1 and 32k keys
// (docs/perf.md, session 12). Not measured at the other head dims, which keep their default.
constexpr int kv_split_stages(int head_dim) {
  return head_dim == 128 ? 3 : kv_default_stages(head_dim);
}

template <int kDim, int kStageCount = kv_default_stages(kDim)>
struct KvCacheTiles {
  static constexpr int kStages = kStageCount;
  static constexpr int kStride = kDim + 8;  // Q's padded rows: conflict-free ldmatrix
  // K, then V, of a stage: 64 rows in 64-column blocks of 128-byte rows, swizzled.
  static constexpr int kTileBytes = kKvTileKeys * kDim * 2;  // 16-bit elements
  static constexpr int kStageBytes = 2 * kTileBytes;
  static constexpr int kQBytes = kKvRows * kStride * 2;
  static constexpr int kBarrierBytes = 64;
  static_assert(8 * kStages <= kBarrierBytes, "one mbarrier per stage");
  // The stages first, at a 1024-byte boundary (the swizzle's period) found at run time in the
  // slack of 1 KB, then Q, then the stages' mbarriers.
  static constexpr int kSharedBytes = 1024 + kStages * kStageBytes + kQBytes + kBarrierBytes;
  // The epilogue's reduction (per warp: 16 rows of O, their max and sum; then per row the
  // warps' weights and the LSE) reuses the stages. O's rows are padded by 8 floats: a warp
  // stores 8 rows x 4 float2 at a time, which rows kDim floats apart put on the same banks
  // (4x the ideal wavefronts under ncu, session 52); 8 floats apart, each half-warp's four rows
  // cover the 32 banks once.
  static constexpr int kORowFloats = kDim + 8;
  static constexpr int kReductionFloats = kKvWarps * kKvRows * (kORowFloats + 3) + kKvRows;
  static_assert(4 * kReductionFloats <= kStages * kStageBytes,
                "the epilogue's reduction must fit in the pipeline's shared memory");
};

// One sequence's extents, read from the device tables.
struct KvSequence {
  int queries, q_start, partial_start;  // partial_start: row t of the split partials
  int cached, new_rows, new_start, keys;
};

__device__ __forceinline__ KvSequence kv_sequence(const KvCacheParams& p, int b) {
  KvSequence s;
  s.q_start = p.cu_seqlens_q ? p.cu_seqlens_q[b] : 0;
  s.queries = p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - s.q_start : p.queries_per_sequence;
  s.partial_start = p.cu_seqlens_q ? s.q_start : b * p.queries_per_sequence;
  s.new_start = p.cu_seqlens_k_new ? p.cu_seqlens_k_new[b] : 0;
  s.new_rows = p.k_new == nullptr   ? 0
               : p.cu_seqlens_k_new ? p.cu_seqlens_k_new[b + 1] - s.new_start
                                    : p.new_per_sequence;
  s.cached = p.cache_seqlens ? p.cache_seqlens[b] : p.cache_length;
  s.keys = s.cached + s.new_rows;
  return s;
}

// Element offset of cache position `pos` of sequence b (head 0).
__device__ __forceinline__ int64_t cache_slot(const KvCacheParams& p, int b, int pos,
                                              int64_t dim0_stride, int64_t row_stride) {
  if (p.block_table == nullptr) return b * dim0_stride + int64_t(pos) * row_stride;
  const int page = p.block_table[b * p.block_table_stride + (pos >> p.page_shift)];
  return int64_t(page) * dim0_stride + int64_t(pos & ((1 << p.page_shift) - 1)) * row_stride;
}

// Keys [begin, end) that query i of a sequence sees (DESIGN.md §3 on the bottom-right diagonal).
__device__ __forceinline__ VisibleRange kv_visible(const KvCacheParams& p, int i, int diagonal,
                                                   int keys) {
  const int center = i + diagonal;
  const int begin = p.window_left < 0 ? 0 : min(keys, max(0, center - p.window_left));
  const int end = p.window_right < 0 ? keys : min(keys, max(0, center + p.window_right + 1));
  return {begin, max(begin, end)};
}

// Copies one row of `count` 16-bit elements, 16 bytes per lane step (rows are 16-byte aligned:
// the host checks).
__device__ __forceinline__ void copy_row(void* destination, const void* source, int count,
                                         int lane) {
  for (int c = lane; c < count / 8; c += 32)
    static_cast<uint4*>(destination)[c] = static_cast<const uint4*>(source)[c];
}

// One warp per (new token, KV head): k_new / v_new into their cache slots.
template <typename Element>
__global__ void kvcache_append_kernel(const KvCacheParams p, int head_dim_qk, int head_dim_v) {
  const int b = blockIdx.y;
  const KvSequence s = kv_sequence(p, b);
  const int warps = blockDim.x / 32, lane = threadIdx.x % 32;
  const int64_t rows = int64_t(s.new_rows) * p.heads_kv;
  for (int64_t r = int64_t(blockIdx.x) * warps + threadIdx.x / 32; r < rows;
       r += int64_t(gridDim.x) * warps) {
    const int token = int(r / p.heads_kv), g = int(r % p.heads_kv);
    const int64_t new_row = s.new_start + token;
    const Element* k_source = static_cast<const Element*>(p.k_new) + b * p.k_new_batch_stride +
                              new_row * p.k_new_row_stride + g * p.k_new_head_stride;
    const Element* v_source = static_cast<const Element*>(p.v_new) + b * p.v_new_batch_stride +
                              new_row * p.v_new_row_stride + g * p.v_new_head_stride;
    Element* k_slot = const_cast<Element*>(static_cast<const Element*>(p.k_cache)) +
                      cache_slot(p, b, s.cached + token, p.k_dim0_stride, p.k_row_stride) +
                      g * p.k_head_stride;
    Element* v_slot = const_cast<Element*>(static_cast<const Element*>(p.v_cache)) +
                      cache_slot(p, b, s.cached + token, p.v_dim0_stride, p.v_row_stride) +
                      g * p.v_head_stride;
    copy_row(k_slot, k_source, head_dim_qk, lane);
    copy_row(v_slot, v_source, head_dim_v, lane);
  }
}

// On sm_90 each stage completes on its mbarrier (128 arrivals: every thread arrives once per
// tile, as cp.async's completion or beside thread 0's TMA boxes); sm_80 counts cp.async groups.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr bool kKvStageBarriers = true;
#else
constexpr bool kKvStageBarriers = false;
#endif

// Starts copying keys [first_key, first_key + 64) of sequence b, KV head g, from the cache into a
// stage's swizzled K and V tiles (rows past the sequence are zeros). A whole tile with a tensor
// map (p.tma) is copied by thread 0 as TMA boxes: 64 columns by min(page size, 64) rows, 2 x
// kDim / 64 per page the tile spans (4 at d128 from a contiguous cache or 64-row pages, 16 from
// 16-row pages, each page's after its table read), instead of the 128 row copies that sm_90
// issued before (session 26's profile:
// issuing those, one lane at a time, held 40% of the decode kernel's stall samples). Otherwise,
// and for the tile that crosses the sequence's end, every thread copies 16-byte chunks with
// cp.async, zero-filled past the sequence.
template <typename Element, int kDim>
__device__ __forceinline__ void load_key_tile(const KvCacheParams& p, uint32_t k_tile,
                                              uint32_t v_tile, uint32_t barrier, int b, int g,
                                              int first_key, int keys) {
  const int valid_rows = min(kKvTileKeys, keys - first_key);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::fence_proxy_async_shared();  // earlier reads and writes of this stage come first
  if (p.tma && valid_rows == kKvTileKeys) {
    if (threadIdx.x == 0) {
      ptx::mbarrier_arrive_expect_tx(barrier, uint32_t(2 * kKvTileKeys * kDim * sizeof(Element)));
      const int page_rows = p.block_table ? min(1 << p.page_shift, kKvTileKeys) : kKvTileKeys;
#pragma unroll 1
      for (int r = 0; r < kKvTileKeys; r += page_rows) {
        const int key = first_key + r;
        int dim0 = b, row = key;
        if (p.block_table) {
          dim0 = p.block_table[b * p.block_table_stride + (key >> p.page_shift)];
          row = key & ((1 << p.page_shift) - 1);
        }
#pragma unroll
        for (int c = 0; c < kDim / 64; ++c) {
          const uint32_t box = ptx::swizzled_offset(kKvTileKeys, r, 64 * c);
          ptx::tma_load_4d(k_tile + box, &p.k_map, 64 * c, row, g, dim0, barrier);
          ptx::tma_load_4d(v_tile + box, &p.v_map, 64 * c, row, g, dim0, barrier);
        }
      }
    } else {
      ptx::mbarrier_arrive(barrier);
    }
    return;
  }
#endif
  const Element* k_head = static_cast<const Element*>(p.k_cache) + g * p.k_head_stride;
  const Element* v_head = static_cast<const Element*>(p.v_cache) + g * p.v_head_stride;
  if (p.block_table) {
    // Each thread keeps one 16-byte column of kRowsPerThread rows. Their pages are loaded
    // together first and serve K and V both: loaded one row at a time beside each copy, the
    // table loads' latency came once per row, and 1-token pages ran at 0.55x of the row copies
    // before (session 26, call 8).
    constexpr int kChunksPerRow = kDim / 8, kRowStep = kKvThreads / kChunksPerRow;
    constexpr int kRowsPerThread = kKvTileKeys / kRowStep;
    static_assert(kKvThreads % kChunksPerRow == 0 && kKvTileKeys % kRowStep == 0,
                  "whole rows per thread");
    const int* pages = p.block_table + b * p.block_table_stride;
    const int column = (int(threadIdx.x) % kChunksPerRow) * 8,
              row0 = int(threadIdx.x) / kChunksPerRow;
    const int in_page = (1 << p.page_shift) - 1;
    int64_t k_offset[kRowsPerThread], v_offset[kRowsPerThread];
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int key = first_key + row0 + i * kRowStep;
      const int64_t page = row0 + i * kRowStep < valid_rows ? pages[key >> p.page_shift] : 0;
      k_offset[i] = page * p.k_dim0_stride + int64_t(key & in_page) * p.k_row_stride + column;
      v_offset[i] = page * p.v_dim0_stride + int64_t(key & in_page) * p.v_row_stride + column;
    }
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const int row = row0 + i * kRowStep;
      const bool valid = row < valid_rows;
      const uint32_t box = ptx::swizzled_offset(kKvTileKeys, row, column);
      ptx::cp_async_16(k_tile + box, valid ? k_head + k_offset[i] : k_head, valid);
      ptx::cp_async_16(v_tile + box, valid ? v_head + v_offset[i] : v_head, valid);
    }
  } else {
    produce_swizzled_tile<Element, kKvTileKeys, kDim, kKvThreads>(
        k_tile, k_head + b * p.k_dim0_stride + int64_t(first_key) * p.k_row_stride, p.k_row_stride,
        valid_rows);
    produce_swizzled_tile<Element, kKvTileKeys, kDim, kKvThreads>(
        v_tile, v_head + b * p.v_dim0_stride + int64_t(first_key) * p.v_row_stride, p.v_row_stride,
        valid_rows);
  }
  if constexpr (kKvStageBarriers) {
    ptx::cp_async_mbarrier_arrive_noinc(barrier);
  } else {
    (void)barrier;
    ptx::cp_async_commit();  // one group per tile, so the wait counts stay fixed
  }
}

// Waits until the tile `consumed` (counted over the whole kernel) has landed in its stage.
template <int kStages>
__device__ __forceinline__ void wait_key_tile(uint32_t barriers, int consumed) {
  if constexpr (kKvStageBarriers) {
    ptx::mbarrier_wait(barriers + 8 * (consumed % kStages), uint32_t(consumed / kStages) & 1u);
  } else {
    (void)barriers;
    (void)consumed;
    ptx::cp_async_wait<kStages - 2>();
  }
}

// Raw scores of one warp's 16 keys -> logits in log2 units (scale or softcap, ALiBi), then the
// mask. Each feature is one branch around a whole loop (a test per element compiles to a branch
// per element).
__device__ __forceinline__ void kv_logits(const KvCacheParams& p, float (&s)[2][4], int n0,
                                          int quad_col, const int (&query)[2],
                                          const float (&slope)[2], const VisibleRange (&range)[2],
                                          int diagonal, bool fully_visible) {
  if (p.use_softcap) {
    const float exp_scale = p.softcap_arg_scale * (2.f * kLog2e);
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[t][e] = fmaf(softcap_ratio(s[t][e], exp_scale), -2.f * p.softcap_log2, p.softcap_log2);
  } else {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] *= p.scale_log2;
  }
  if (p.alibi_slopes) {
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int half = e / 2, j = n0 + 8 * t + 2 * quad_col + (e & 1);
        s[t][e] -= slope[half] * fabsf(float(query[half] + diagonal - j));
      }
  }
  if (fully_visible) return;
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = e / 2, j = n0 + 8 * t + 2 * quad_col + (e & 1);
      if (j < range[half].begin || j >= range[half].end) s[t][e] = -INFINITY;
    }
}

template <typename Element, int kDim, int kStageCount>
__global__ void __launch_bounds__(kKvThreads)
    kvcache_attention_kernel(const __grid_constant__ KvCacheParams p) {
  using Tiles = KvCacheTiles<kDim, kStageCount>;
  constexpr int kStride = Tiles::kStride, kStages = Tiles::kStages;
  constexpr int kVTiles = kDim / 8;
  constexpr int kBytes = int(sizeof(Element));
  extern __shared__ __align__(1024) unsigned char shared_bytes[];
  // kStages x {K, V} (swizzled, from a 1024-byte boundary), Q [16, kStride], the mbarriers.
  const uint32_t shared_base = ptx::shared_address(shared_bytes);
  const uint32_t stages = (shared_base + 1023u) & ~1023u;
  unsigned char* stages_generic = shared_bytes + (stages - shared_base);
  Element* q_shared = reinterpret_cast<Element*>(stages_generic + kStages * Tiles::kStageBytes);
  const uint32_t barriers = stages + kStages * Tiles::kStageBytes + Tiles::kQBytes;
  auto stage_of = [&](int tile_count) {
    return stages + uint32_t((tile_count % kStages) * Tiles::kStageBytes);
  };
  if constexpr (kKvStageBarriers) {
    if (threadIdx.x < kStages) ptx::mbarrier_init(barriers + 8 * threadIdx.x, kKvThreads);
    __syncthreads();
  }

  const int split = int(blockIdx.x % unsigned(p.num_splits));
  const int sequence_head = int(blockIdx.x / unsigned(p.num_splits));
  const int b = sequence_head / p.heads_kv, g = sequence_head % p.heads_kv;
  const KvSequence s = kv_sequence(p, b);
  const int rows = s.queries * p.group;
  const int diagonal = s.keys - s.queries;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.tma && threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&p.k_map);
    ptx::prefetch_tensor_map(&p.v_map);
  }
#endif

  const uint32_t q_lane = ptx::shared_address(q_shared + (lane % 16) * kStride + (lane / 16) * 8);
  // ldmatrix rows in the swizzled tiles: this lane's K row (S = Q K^T) and V row (O += P V), and
  // the swizzle phase of its 16-byte chunk. Step kk reads chunk 2 kk + h of the row (h: the
  // lane's half of the k16 step), which lies at ((2 kk) % 8 ^ h ^ row % 8) in the row's 64-column
  // block kk / 4 (2 kk % 8 is even, so adding h is an xor).
  const int k_row = warp * 16 + (lane / 16) * 8 + lane % 8, v_row = warp * 16 + lane % 16;
  const uint32_t k_lane = k_row * 128, v_lane = Tiles::kTileBytes + v_row * 128;
  const int k_phase = ((lane / 8) % 2) ^ (k_row % 8), v_phase = (lane / 16) ^ (v_row % 8);
  auto swizzled_step = [](int step, int phase) {
    return uint32_t((step / 4) * kKvTileKeys * 128 + ((((2 * step) % 8) ^ phase) << 4));
  };
  // Tiles issued and consumed by this block so far (they pick the stage and barrier phase).
  int issued = 0, consumed = 0;
  auto issue = [&](int tile) {
    const uint32_t stage = stage_of(issued);
    load_key_tile<Element, kDim>(p, stage, stage + Tiles::kTileBytes,
                                 barriers + 8 * (issued % kStages), b, g, tile * kKvTileKeys,
                                 s.keys);
    ++issued;
  };

  for (int m0 = int(blockIdx.y) * kKvRows; m0 < rows; m0 += int(gridDim.y) * kKvRows) {
    __syncthreads();  // the previous rows' epilogue is done with shared memory
    const int rows_here = min(kKvRows, rows - m0);
    const VisibleRange first = kv_visible(p, p.by_group.quotient(m0), diagonal, s.keys);
    const VisibleRange last =
        kv_visible(p, p.by_group.quotient(m0 + rows_here - 1), diagonal, s.keys);
    // Visible ranges grow with the query, so the rows' union lies in [first.begin, last.end).
    const int tile_begin = first.begin / kKvTileKeys;
    const int tile_end =
        last.end <= first.begin ? tile_begin : (last.end + kKvTileKeys - 1) / kKvTileKeys;
    // Split s takes tiles tile_begin + s, + s + num_splits, ...: the splits sweep the cache
    // together, so the blocks in flight read one moving window of it, and every split gets
    // within one tile of the others (a contiguous share of ceil(tiles / splits) left the last
    // splits short or empty).
    const int my_tiles = split < tile_end - tile_begin
                             ? (tile_end - tile_begin - split + p.num_splits - 1) / p.num_splits
                             : 0;
    auto my_tile = [&](int i) { return tile_begin + split + i * p.num_splits; };

    // Q: packed row r is query r / group of head g * group + r % group.
    const Element* q_base = static_cast<const Element*>(p.q) + b * p.q_batch_stride;
    for (int chunk = threadIdx.x; chunk < kKvRows * (kDim / 8); chunk += kKvThreads) {
      const int row = chunk / (kDim / 8), column = (chunk % (kDim / 8)) * 8;
      const bool valid = row < rows_here;
      const int packed = m0 + (valid ? row : 0);
      const int i = p.by_group.quotient(packed);
      const int64_t offset = int64_t(s.q_start + i) * p.q_row_stride +
                             int64_t(g * p.group + packed - i * p.group) * p.q_head_stride;
      ptx::cp_async_16(ptx::shared_address(q_shared + row * kStride + column),
                       q_base + offset + column, valid);
    }
    ptx::cp_async_commit();
#pragma unroll
    for (int stage = 0; stage < kStages - 1; ++stage) {
      if (stage < my_tiles) {
        issue(my_tile(stage));
      } else if constexpr (!kKvStageBarriers) {
        ptx::cp_async_commit();  // an empty group keeps the wait counts fixed
      }
    }
    // A block of exactly kStages tiles (a decode step's 128-key window: two tiles on two stages,
    // or three on the deeper pipeline that kvcache_whole_range_in_flight gives it) issues its
    // last one now as well, on the stage barriers: the loop would issue it only once the first
    // had landed, paying one more copy's latency in a block that has little else to do. Not at
    // d = 256, whose registers are full (ptxas spilled its two-stage form with it).
    const bool all_ahead = kKvStageBarriers && kDim <= 128 && my_tiles == kStages;
    if (all_ahead) issue(my_tile(kStages - 1));
    // Stage barriers do not count cp.async groups: Q is awaited here, after the first tiles are
    // on their way (the first tile's __syncthreads publishes it to every warp).
    if constexpr (kKvStageBarriers) ptx::cp_async_wait<0>();

    // This thread's two rows (g and g + 8 of the slab): their query, ALiBi slope and range.
    int query[2];
    float slope[2];
    VisibleRange range[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int packed = m0 + quad_row + 8 * half;
      query[half] = p.by_group.quotient(packed);
      const int head = g * p.group + packed - query[half] * p.group;
      slope[half] = p.alibi_slopes && quad_row + 8 * half < rows_here
                        ? p.alibi_slopes[b * p.alibi_batch_stride + head] * kLog2e
                        : 0.f;
      range[half] = kv_visible(p, query[half], diagonal, s.keys);
    }

    RowStats stats;
    stats.max[0] = stats.max[1] = -INFINITY;
    stats.sum[0] = stats.sum[1] = 0.f;
    float o_acc[kVTiles][4];
#pragma unroll
    for (int t = 0; t < kVTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) o_acc[t][e] = 0.f;

    for (int i = 0; i < my_tiles; ++i) {
      const int tile = my_tile(i);
      wait_key_tile<kStages>(barriers, consumed);
      __syncthreads();  // this tile landed; every warp is done with the stage refilled next
      const uint32_t stage = stage_of(consumed);
      ++consumed;
      if (i + kStages - 1 < my_tiles && !all_ahead) {
        issue(my_tile(i + kStages - 1));
      } else if constexpr (!kKvStageBarriers) {
        ptx::cp_async_commit();
      }

      // S = Q K^T over this warp's 16 keys: two accumulator chains per n8 tile (even and odd
      // k-steps) halve the dependent mma latency.
      float s_acc[2][4] = {}, s_odd[2][4] = {};
#pragma unroll
      for (int kk = 0; kk < kDim / 16; ++kk) {
        uint32_t a[4], bk[4];
        ptx::ldmatrix_x4(a, q_lane + kk * 16 * kBytes);
        ptx::ldmatrix_x4(bk, stage + k_lane + swizzled_step(kk, k_phase));
        const uint32_t b_even[2] = {bk[0], bk[1]}, b_odd[2] = {bk[2], bk[3]};
        float(&target)[2][4] = kk % 2 == 0 ? s_acc : s_odd;
        ptx::mma_m16n8k16<Element>(target[0], a, b_even);
        ptx::mma_m16n8k16<Element>(target[1], a, b_odd);
      }
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) s_acc[t][e] += s_odd[t][e];

      const int n0 = tile * kKvTileKeys + warp * 16;
      kv_logits(p, s_acc, n0, quad_col, query, slope, range, diagonal,
                n0 >= last.begin && n0 + 16 <= first.end);
      float correction[2];
      softmax_update(s_acc, stats, correction);
      rescale_rows_if_moved(o_acc, correction);

      // O += P V.
      uint32_t a[4];
      pack_p_operand<Element>(s_acc, 0, a);
#pragma unroll
      for (int pair = 0; pair < kVTiles / 2; ++pair) {
        uint32_t bv[4];
        ptx::ldmatrix_x4_trans(bv, stage + v_lane + swizzled_step(pair, v_phase));
        const uint32_t b_even[2] = {bv[0], bv[1]}, b_odd[2] = {bv[2], bv[3]};
        ptx::mma_m16n8k16<Element>(o_acc[2 * pair], a, b_even);
        ptx::mma_m16n8k16<Element>(o_acc[2 * pair + 1], a, b_odd);
      }
    }
    if constexpr (!kKvStageBarriers) ptx::cp_async_wait<0>();
    __syncthreads();  // every warp is done with the stages: the reduction reuses them
    // The four warps' states: O (relative to each warp's max), max and sum per row.
    constexpr int kORow = Tiles::kORowFloats;
    float* warp_o = reinterpret_cast<float*>(stages_generic);  // [warp][row][kORow]
    float* warp_max = warp_o + kKvWarps * kKvRows * kORow;     // [warp][row]
    float* warp_sum = warp_max + kKvWarps * kKvRows;
    float* warp_weight = warp_sum + kKvWarps * kKvRows;  // [warp][row]: its factor in the result
    float* row_lse = warp_weight + kKvWarps * kKvRows;   // [row]
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = stats.sum[half];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      const int row = warp * kKvRows + quad_row + 8 * half;
      if (quad_col == 0) {
        warp_max[row] = stats.max[half];
        warp_sum[row] = sum;
      }
#pragma unroll
      for (int t = 0; t < kVTiles; ++t)
        *reinterpret_cast<float2*>(warp_o + row * kORow + 8 * t + 2 * quad_col) =
            make_float2(o_acc[t][2 * half], o_acc[t][2 * half + 1]);
    }
    __syncthreads();
    if (threadIdx.x < kKvRows) {
      const int row = threadIdx.x;
      float max = -INFINITY;
      for (int w = 0; w < kKvWarps; ++w) max = max_keeping_nan(max, warp_max[w * kKvRows + row]);
      const float shift = max == -INFINITY ? 0.f : max;
      float sum = 0.f;
      for (int w = 0; w < kKvWarps; ++w)
        sum += warp_sum[w * kKvRows + row] * fast_exp2(warp_max[w * kKvRows + row] - shift);
      // sum = 0: no key seen (lse -inf, o 0); a NaN logit keeps the row NaN.
      float lse = sum == 0.f ? -INFINITY : (max + __log2f(sum)) * kLn2;
      float scale = sum == 0.f ? 0.f : 1.f / sum;
      if (p.num_splits == 1) {  // the sink joins here, once per row (else in the merge)
        const int head = g * p.group + (m0 + row) - p.by_group.quotient(m0 + row) * p.group;
        const float sink = sink_logit(p.softmax_type, p.softmax_offset, head);
        const float top = max_keeping_nan(lse, sink);
        const float top_shift = top == -INFINITY ? 0.f : top;
        const float total = expf(lse - top_shift) + expf(sink - top_shift);
        const float merged = total == 0.f ? -INFINITY : top_shift + logf(total);
        scale *= total == 0.f ? 0.f : expf(lse - merged);
        lse = merged;
      }
      for (int w = 0; w < kKvWarps; ++w)
        warp_weight[w * kKvRows + row] = scale * fast_exp2(warp_max[w * kKvRows + row] - shift);
      row_lse[row] = lse;
    }
    __syncthreads();

    // Rows out: o and the LSE, or this split's partials.
    for (int e = threadIdx.x; e < rows_here * (kDim / 2); e += kKvThreads) {
      const int row = e / (kDim / 2), column = 2 * (e % (kDim / 2));
      float2 value = make_float2(0.f, 0.f);
#pragma unroll
      for (int w = 0; w < kKvWarps; ++w) {
        const float weight = warp_weight[w * kKvRows + row];
        const float2 part =
            *reinterpret_cast<const float2*>(warp_o + (w * kKvRows + row) * kORow + column);
        value.x += weight * part.x;
        value.y += weight * part.y;
      }
      const int packed = m0 + row, i = p.by_group.quotient(packed);
      const int head = g * p.group + packed - i * p.group;
      if (p.num_splits == 1) {
        Element* o_row = static_cast<Element*>(p.o) + b * p.o_batch_stride +
                         int64_t(s.q_start + i) * p.o_row_stride + head * p.o_head_stride;
        *reinterpret_cast<uint32_t*>(o_row + column) = ptx::pack2<Element>(value.x, value.y);
        if (column == 0 && p.lse)
          p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + s.q_start + i] = row_lse[row];
      } else {
        const int64_t partial = (split * p.total_rows + s.partial_start + i) * p.heads_q + head;
        *reinterpret_cast<float2*>(p.partial_o + partial * kDim + column) = value;
        if (column == 0) p.partial_lse[partial] = row_lse[row];
      }
    }
  }
}

// One block per (query, head) row of a sequence (merge_row): the splits' partials into o and
// the LSE.
static_assert(kKvCacheMaxSplits <= kMergeMaxSplits, "merge_row holds every split's weight");
template <typename Element>
__global__ void __launch_bounds__(kMergeThreads)
    kvcache_merge_kernel(const KvCacheParams p, int head_dim_v) {
  const int b = blockIdx.y;
  const KvSequence s = kv_sequence(p, b);  // the call's tables: no kernel of it writes them
  const int64_t rows = int64_t(s.queries) * p.heads_q;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // Launched as the attention's programmatic dependent (launch_kvcache_merge): its blocks may
  // start while the attention's last ones run; the partials are read only after the whole
  // attention grid has finished and its writes are visible.
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int i = int(r / p.heads_q), head = int(r % p.heads_q);
    Element* o_row = static_cast<Element*>(p.o) + b * p.o_batch_stride +
                     int64_t(s.q_start + i) * p.o_row_stride + head * p.o_head_stride;
    const float lse =
        merge_row(p.partial_lse, p.partial_o, p.total_rows * p.heads_q,
                  int64_t(s.partial_start + i) * p.heads_q + head, p.num_splits,
                  sink_logit(p.softmax_type, p.softmax_offset, head), head_dim_v, o_row);
    if (threadIdx.x == 0 && p.lse)
      p.lse[b * p.lse_batch_stride + head * p.lse_head_stride + s.q_start + i] = lse;
  }
}

}  // namespace dpa::cuda
