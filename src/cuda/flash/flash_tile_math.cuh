// The per-tile math both flash forward kernel families share (mma.sync for sm_80+, wgmma for
// sm_90a): block setup, dropout keep bits, the logit transform and mask, the online-softmax
// update and the epilogue. Both families hold S and O in the same per-warp fragment layout
// (mma.sync's C layout: a thread owns rows g and g + 8 of a 16-row slab, and columns
// 8t + 2q + {0, 1} of each n8 tile t, g = lane / 4, q = lane % 4), so one slab's math is one
// set of functions over `float (&)[tiles][4]` fragments.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/philox.h"
#include "cuda/device_common.cuh"
#include "cuda/flash/flash_params.h"
#include "cuda/ptx/mma.cuh"

namespace dpa::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// exp2 on the special-function unit (MUFU.EX2, ~2 ulp; flushes denormals, which softmax
// weights below 2^-126 of the row max never need). exp2f() adds range handling around it.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x on one MUFU.RCP (rcp.approx.ftz.f32, ~1 ulp). __fdividef(1, x) adds a range test and
// two predicated scalings per call; the softcap's x = exp2(..) + 1 is in [1, inf], where the
// plain reciprocal is exact enough and gives 0 for inf.
__device__ __forceinline__ float fast_rcp(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The softcap's accurate tanh, shared by the forward and every backward kernel: for a raw
// score u, tanh(u a) = 1 - 2r with r = softcap_ratio(u, softcap_exp_scale(p)) =
// 1 / (exp2(2 u a log2 e) + 1) (a = scale / cap): one EX2 and one RCP. r is 0 when the exp2
// overflows and 1 when it underflows, so logits saturate at +-cap without NaN.
__device__ __forceinline__ float softcap_exp_scale(const FlashForwardParams& p) {
  return p.softcap_arg_scale * (2.f * kLog2e);
}
__device__ __forceinline__ float softcap_ratio(float raw_score, float exp_scale) {
  return fast_rcp(fast_exp2(raw_score * exp_scale) + 1.f);
}

// The softcap's logits c' tanh(u a) - shift = c' - shift - 2c' r for four scores of one row,
// with one MUFU.RCP for the four reciprocals r = 1 / x (x = exp2(2 u a log2 e) + 1): the MUFU
// unit, which runs every exp2 and reciprocal, is what bounds the capped softmax (three MUFU
// operations per element with a reciprocal each; ncu: 80% busy at d = 64). One reciprocal of
// the product x_a x_b x_c x_d and six multiplications replace four reciprocals; each result
// is within a few ulp of its own reciprocal (r may come out an ulp above 1 where x = 1; for
// caps below ~0.09 the products of tiny terms can flush, an error below 2^-57 in log2 units).
// x is clamped to 2^31 (r = 2^-31 for larger x moves c' tanh by 2^-30 c', below fp32's
// rounding of c') so the product stays at most 2^124, and the clamp keeps NaN: a NaN score
// makes its three neighbours NaN too, which is why the caller takes this only where every
// element is one the row keeps (a row with a NaN logit is NaN anyway) and not where the mask
// may drop the NaN.
__device__ __forceinline__ float softcap_denominator(float raw_score, float exp_scale) {
  return min_keeping_nan(fast_exp2(raw_score * exp_scale) + 1.f, 0x1p31f);
}

__device__ __forceinline__ void softcap_logits_of_four(float& a, float& b, float& c, float& d,
                                                       float exp_scale, float slope, float offset) {
  const float xa = softcap_denominator(a, exp_scale), xb = softcap_denominator(b, exp_scale);
  const float xc = softcap_denominator(c, exp_scale), xd = softcap_denominator(d, exp_scale);
  const float ab = xa * xb, cd = xc * xd;
  const float slope_over_all = fast_rcp(ab * cd) * slope;
  const float slope_over_ab = slope_over_all * cd, slope_over_cd = slope_over_all * ab;
  a = fmaf(slope_over_ab, xb, offset);
  b = fmaf(slope_over_ab, xa, offset);
  c = fmaf(slope_over_cd, xd, offset);
  d = fmaf(slope_over_cd, xc, offset);
}

// Key range [begin, end) visible to query row i of a sequence (DESIGN.md §3).
struct VisibleRange {
  int begin, end;
};

__device__ __forceinline__ VisibleRange visible_range(const FlashForwardParams& p, int i,
                                                      int seqlen_q, int seqlen_kv, int diagonal) {
  if (i >= seqlen_q || seqlen_kv == 0) return {0, 0};
  const int center = i + diagonal;
  // A window left of every key stays empty at skv (visible_keys() of core/attention_math.h),
  // so no block loops over KV tiles past the sequence.
  int begin = p.window_left < 0 ? 0 : min(seqlen_kv, max(0, center - p.window_left));
  int end = p.window_right < 0 ? seqlen_kv : min(seqlen_kv, center + p.window_right + 1);
  return {begin, max(begin, end)};  // end >= begin: mask_invisible_keys relies on it
}

// What one block of kBlockM query rows of one (batch, head, split) works on.
template <typename Element>
struct FlashBlock {
  int batch, head, split, seqlen_q, seqlen_kv, m0, rows_here;
  VisibleRange first_row, last_row;  // visible keys of the block's first and last real rows
  int n_block_begin, n_block_end;    // KV tiles to visit
  int diagonal;                      // key index of query 0's diagonal
  float alibi_slope;                 // log2 units
  const Element *q, *k, *v;          // first row of the block's Q tile; row 0 of K and V
};

// Returns false when the block has no rows (nothing to do). `m_block`, `head` and
// `batch_split` (batch * num_splits + split) name the block.
template <typename Element>
__device__ __forceinline__ bool make_flash_block(const FlashForwardParams& p, int block_m,
                                                 int block_n, int m_block, int head,
                                                 int batch_split, FlashBlock<Element>& b) {
  b.batch = batch_split / p.num_splits;
  b.split = batch_split % p.num_splits;
  b.head = head;
  b.seqlen_q = p.seqlen_q[b.batch];
  b.seqlen_kv = p.seqlen_kv[b.batch];
  b.m0 = m_block * block_m;
  if (b.m0 >= b.seqlen_q) return false;
  b.rows_here = min(block_m, b.seqlen_q - b.m0);

  b.diagonal = p.diagonal[b.batch];
  // KV tiles this block visits: the union of its rows' visible ranges, cut to its split.
  b.first_row = visible_range(p, b.m0, b.seqlen_q, b.seqlen_kv, b.diagonal);
  b.last_row = visible_range(p, b.m0 + b.rows_here - 1, b.seqlen_q, b.seqlen_kv, b.diagonal);
  b.n_block_begin = b.first_row.begin / block_n;
  b.n_block_end = (b.last_row.end + block_n - 1) / block_n;
  if (b.last_row.end <= b.first_row.begin) b.n_block_end = b.n_block_begin;
  if (p.num_splits > 1) {
    const int split_begin = b.split * p.blocks_per_split;
    b.n_block_begin = max(b.n_block_begin, split_begin);
    b.n_block_end = min(b.n_block_end, split_begin + p.blocks_per_split);
    // A split past the block's visible tiles visits none (never a negative count: the
    // warp-specialised kernel's producer and consumers must skip the same blocks).
    b.n_block_end = max(b.n_block_end, b.n_block_begin);
  }
  b.alibi_slope =
      p.alibi_slopes ? p.alibi_slopes[b.batch * p.alibi_batch_stride + b.head] * kLog2e : 0.f;

  const int kv_head = b.head / p.group_size;
  const int64_t q_row0 = (p.start_q ? p.start_q[b.batch] : 0) + b.m0;
  const int64_t kv_row0 = p.start_kv ? p.start_kv[b.batch] : 0;
  b.q = static_cast<const Element*>(p.q) + b.batch * p.q_batch_stride + q_row0 * p.q_row_stride +
        b.head * p.q_head_stride;
  // Paged K and V: the head's column of page 0 (the producer finds each row's page).
  const int64_t k_batch = p.block_table ? 0 : b.batch * p.k_batch_stride;
  const int64_t v_batch = p.block_table ? 0 : b.batch * p.v_batch_stride;
  b.k = static_cast<const Element*>(p.k) + k_batch + kv_row0 * p.k_row_stride +
        kv_head * p.k_head_stride;
  b.v = static_cast<const Element*>(p.v) + v_batch + kv_row0 * p.v_row_stride +
        kv_head * p.v_head_stride;
  return true;
}

// The block of a grid of (m blocks, heads, batch * splits).
template <typename Element>
__device__ __forceinline__ bool make_flash_block(const FlashForwardParams& p, int block_m,
                                                 int block_n, FlashBlock<Element>& b) {
  return make_flash_block(p, block_m, block_n, int(blockIdx.x), int(blockIdx.y), int(blockIdx.z),
                          b);
}

// The sink's logit in log2 units, or -inf where it does not join (none, or a split-KV
// partial: the merge adds it once).
__device__ __forceinline__ float block_sink_log2(const FlashForwardParams& p, int head) {
  return p.num_splits > 1 || p.exclude_sink
             ? -INFINITY
             : sink_logit(p.softmax_type, p.softmax_offset, head) * kLog2e;
}

// Running max and sum of one thread's two rows of a slab. The sink starts the max and (once
// per row: quad lane 0) the sum.
struct RowStats {
  float max[2], sum[2];
};

__device__ __forceinline__ RowStats initial_row_stats(float sink_log2, int quad_col) {
  RowStats r;
  for (int half = 0; half < 2; ++half) {
    r.max[half] = sink_log2;
    r.sum[half] = (sink_log2 != -INFINITY && quad_col == 0) ? 1.f : 0.f;
  }
  return r;
}

// Softcap without a running max (FlashForwardParams::softcap_fixed_max, bf16 P only): every
// logit lies in [-c', c'] (log2 units), so P = exp2(s - m) with the head's fixed m =
// max(c' - kSoftcapFixedMaxHeadroom, sink) stays in [2^-81, 2^64] for c' <= 72.5 (the host's
// rule, softcap_fixed_max_applies): no overflow in bf16 or the fp32 sums (N 2^64 |V| stays far
// below 2^128 for any realistic V), and the floor leaves P V and the sink's term exp2(sink - m)
// about 45 binades above fp32's smallest normal, so nothing a running max would keep flushes.
// The block then takes no max per tile, no correction and no O rescale. A sink above c' - 64
// raises m.
constexpr float kSoftcapFixedMaxHeadroom = 64.f;

struct SoftmaxShift {
  bool fixed = false;     // the fixed m below instead of the online max
  float shift = 0.f;      // m, subtracted inside the logit transform (0 when not fixed)
  float max_slack = 8.f;  // the online max's slack (FlashForwardParams::max_slack)
  // Plain scores (no softcap, no ALiBi): transform_logits leaves them raw and softmax_update
  // folds scale_log2 into the exp2's FFMA, exp2(s * scale - m), and scales the tile's max
  // once per row instead (scale > 0, so the max of the raw scores scales to the max of the
  // logits): one FMUL per score less, as in FlashAttention-3 and -4.
  bool scale_in_exp2 = false;
  float score_scale = 1.f;  // scale_log2 where scale_in_exp2, else 1 (already logits)
};

// The shift of a block whose logits are its scores times the scale (no softcap, no ALiBi):
// the online max on raw scores, the scale in the exp2.
__device__ __forceinline__ SoftmaxShift plain_softmax_shift(const FlashForwardParams& p) {
  SoftmaxShift shift;
  shift.max_slack = p.max_slack;
  shift.scale_in_exp2 = true;
  shift.score_scale = p.scale_log2;
  return shift;
}

// The shift of a capped block whose max is fixed (FlashForwardParams::softcap_fixed_max).
__device__ __forceinline__ SoftmaxShift softcap_fixed_softmax_shift(const FlashForwardParams& p,
                                                                    float sink_log2) {
  SoftmaxShift shift;
  shift.max_slack = p.max_slack;
  shift.fixed = true;
  shift.shift = fmaxf(p.softcap_log2 - kSoftcapFixedMaxHeadroom, sink_log2);
  return shift;
}

// The shift of a block of any features, chosen at run time. Its fields are set one by one, not
// by returning the helpers above: that form made ptxas spill 24 more bytes in the d256
// two-warpgroup kernel (session 25).
template <typename Element>
__device__ __forceinline__ SoftmaxShift block_softmax_shift(const FlashForwardParams& p,
                                                            float sink_log2) {
  SoftmaxShift shift;
  shift.max_slack = p.max_slack;
  if (!p.use_softcap && !p.alibi_slopes) {
    shift.scale_in_exp2 = true;
    shift.score_scale = p.scale_log2;
  }
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {  // fp16 P would overflow at 2^16
    if (p.use_softcap && p.softcap_fixed_max) {
      shift.fixed = true;
      shift.shift = fmaxf(p.softcap_log2 - kSoftcapFixedMaxHeadroom, sink_log2);
    }
  }
  return shift;
}

// The statistics a block starts from: the sink starts the max and the sum (quad lane 0), or,
// with a fixed m, the sum alone as exp2(sink - m).
__device__ __forceinline__ RowStats initial_row_stats(float sink_log2, int quad_col,
                                                      const SoftmaxShift& shift) {
  if (!shift.fixed) return initial_row_stats(sink_log2, quad_col);
  RowStats r;
  for (int half = 0; half < 2; ++half) {
    r.max[half] = shift.shift;
    r.sum[half] =
        (sink_log2 != -INFINITY && quad_col == 0) ? fast_exp2(sink_log2 - shift.shift) : 0.f;
  }
  return r;
}

// Dropout keep bits of one slab's tile, drawn before S exists so Philox's registers never
// compete with the S accumulators. A thread's keys 2q + {0, 1} of each 8-key Philox block are
// the low and high halves of word q; bit 2t (+1) of bits[half] is key 8t + 2q (+1). `row0` is
// the slab's row g (half 0). A CP tile draws at its global row, key and head (its keys start on
// a multiple of 8). The four threads of a quad need the four words of the same blocks, so each
// draws every fourth block (t = 4u + q) and the quad transposes the words with three
// shuffles per four blocks: one Philox block per 8 keys instead of one per 2. Every lane of the
// warp must call it (the shuffles).
template <int kNTiles, typename Element>
__device__ __forceinline__ void draw_keep_bits(const FlashForwardParams& p,
                                               const FlashBlock<Element>& b, int row0, int n0,
                                               int quad_col, uint32_t (&bits)[2]) {
  static_assert(2 * kNTiles <= 32, "keep bits of one row must fit a 32-bit word");
  static_assert(kNTiles % 4 == 0, "a quad draws four blocks at a time");
  const int heads = p.heads_total, head = b.head + p.head_offset;
  // Read here rather than kept in FlashBlock: two registers less through the main loop.
  row0 += p.q_position[b.batch];
  n0 += p.kv_position[b.batch];
  // Word i of a block in registers (compares, not an indexed array, keep it out of memory).
  auto word_of = [](const Philox4& block, int i) {
    return i == 0 ? block.x[0] : i == 1 ? block.x[1] : i == 2 ? block.x[2] : block.x[3];
  };
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    bits[half] = 0;
#pragma unroll 1
    for (int u = 0; u < kNTiles / 4; ++u) {
      const Philox4 block = dropout_block(p.seed, p.offset, b.batch, heads, head, row0 + 8 * half,
                                          n0 + 8 * (4 * u + quad_col));
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        // Round r: this thread takes word q of the block drawn by quad lane q ^ r, which hands
        // over its word q ^ r.
        const uint32_t mine = word_of(block, quad_col ^ r);
        const uint32_t word = r == 0 ? mine : __shfl_xor_sync(0xffffffffu, mine, r);
        const int t = 4 * u + (quad_col ^ r);
        const uint32_t keep_low = (word & 0xffffu) >= p.dropout_threshold ? 1u : 0u;
        const uint32_t keep_high = (word >> 16) >= p.dropout_threshold ? 2u : 0u;
        bits[half] |= (keep_low | keep_high) << (2 * t);
      }
    }
  }
}

// Sets the scores of keys a row does not see to -inf.
template <typename Element, int kNTiles>
__device__ __forceinline__ void mask_invisible_keys(const FlashForwardParams& p,
                                                    const FlashBlock<Element>& b,
                                                    float (&s)[kNTiles][4], int row0, int n0,
                                                    int quad_col) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const VisibleRange range =
        visible_range(p, row0 + 8 * half, b.seqlen_q, b.seqlen_kv, b.diagonal);
    // Key j is visible iff j - begin < end - begin as unsigned (visible_range keeps end >=
    // begin): one compare per element of a register plus a constant against another. Two
    // signed compares per element made ptxas hold the keys' indices in registers and spill
    // (d = 64, three consumers: 112 bytes of spills, 52 with this form).
    const int from_begin = n0 + 2 * quad_col - range.begin;
    const unsigned width = unsigned(range.end - range.begin);
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e)
        if (unsigned(from_begin + 8 * t + e) >= width) s[t][2 * half + e] = -INFINITY;
  }
}

// Raw scores -> capped logits in log2 units, minus `shift` (a fixed max, SoftmaxShift).
// Accurate tanh (softcap_ratio) with the cap folded into the last FFMA: c' tanh(u a) = c' - 2c' r
// (c' = c log2 e). An element costs FMUL, MUFU.EX2, FADD, MUFU.RCP, FFMA; in a fully visible
// tile four elements of a row share the MUFU.RCP (softcap_logits_of_four). (tanh.approx.f32
// would save the reciprocal, but its ~5e-4 relative error moves capped logits by up to
// c * 5e-4.)
template <int kNTiles>
__device__ __forceinline__ void softcap_logits(const FlashForwardParams& p, float (&s)[kNTiles][4],
                                               bool fully_visible, float shift) {
  const float exp_scale = softcap_exp_scale(p);
  const float slope = -2.f * p.softcap_log2;
  const float offset = p.softcap_log2 - shift;
  if (fully_visible) {
    static_assert(kNTiles % 2 == 0, "four elements of a row come from two n8 tiles");
#pragma unroll
    for (int t = 0; t < kNTiles; t += 2)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        softcap_logits_of_four(s[t][e], s[t][e + 1], s[t + 1][e], s[t + 1][e + 1], exp_scale, slope,
                               offset);
  } else {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = fmaf(softcap_ratio(s[t][e], exp_scale), slope, offset);
  }
}

// Raw scores -> logits in log2 units (scale or softcap, ALiBi), then the mask. Each feature
// is one branch around a whole loop: a test per element compiles to a branch per element.
// `row0` is the slab's row g, `n0` the tile's first key, `fully_visible` whether every real
// row of the block sees every key of the tile: exact, not a hint (it skips the mask, and the
// shared reciprocals would let a NaN key past the sequence reach the keys beside it).
// `shift` (softcap only: a fixed max, SoftmaxShift) is subtracted inside the last FFMA;
// `scale_in_exp2` (SoftmaxShift) leaves plain scores raw for softmax_update to scale.
template <typename Element, int kNTiles>
__device__ __forceinline__ void transform_logits(const FlashForwardParams& p,
                                                 const FlashBlock<Element>& b,
                                                 float (&s)[kNTiles][4], int row0, int n0,
                                                 int quad_col, bool fully_visible,
                                                 float shift = 0.f, bool scale_in_exp2 = false) {
  if (p.use_softcap) {
    softcap_logits(p, s, fully_visible, shift);
  } else if (!scale_in_exp2) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] *= p.scale_log2;
  }
  if (p.alibi_slopes) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = row0 + 8 * (e / 2);
#pragma unroll
      for (int t = 0; t < kNTiles; ++t) {
        const int j = n0 + 8 * t + 2 * quad_col + (e & 1);
        s[t][e] -= b.alibi_slope * fabsf(float(i + b.diagonal - j));
      }
    }
  }
  if (!fully_visible) mask_invisible_keys(p, b, s, row0, n0, quad_col);
}

// Tree reductions over the first kLive values of a fragment (short dependency chains), written
// as template recursion so every step unrolls: nvcc leaves a `stride /= 2` loop rolled at 16
// values and the array then lives in local memory. Each step folds the upper half onto the
// lower one; an odd count keeps its middle value for the next step (80-key tiles have 10).
template <int kLive, int kCount>
__device__ __forceinline__ float tree_max(float (&v)[kCount]) {
  if constexpr (kLive == 1) {
    return v[0];
  } else {
    constexpr int kKept = (kLive + 1) / 2;
#pragma unroll
    for (int t = 0; t < kLive / 2; ++t) v[t] = max_keeping_nan(v[t], v[t + kKept]);
    return tree_max<kKept>(v);
  }
}

template <int kLive, int kCount>
__device__ __forceinline__ float tree_sum(float (&v)[kCount]) {
  if constexpr (kLive == 1) {
    return v[0];
  } else {
    constexpr int kKept = (kLive + 1) / 2;
#pragma unroll
    for (int t = 0; t < kLive / 2; ++t) v[t] += v[t + kKept];
    return tree_sum<kKept>(v);
  }
}

// The running max moves only when a tile's max passes it by more than `max_slack` (log2 units;
// FlashAttention-4's conditional rescale; kMaxSlack unless the forward's plan lowers it,
// FlashForwardParams::max_slack): P = exp2(s - m) then stays below 2^8, which every P type
// (fp16 included) and the fp32 sums hold as exactly as P <= 1, and the correction is exactly 1
// for a row that kept its max, so a warp whose rows all kept theirs skips the O rescale
// (rescale_rows_if_moved). Exact: m cancels in O / l and enters the LSE as m + log2 l
// whichever m it is.
constexpr float kMaxSlack = 8.f;

// Online-softmax update of one slab's statistics: S (logits in log2 units once multiplied by
// `score_scale`, SoftmaxShift) becomes P = exp2(S - max) and the row statistics absorb the
// tile. Returns, per row, the factor that rescales everything accumulated so far (O) to the new
// max (1 where the max did not move).
template <int kNTiles>
__device__ __forceinline__ void softmax_update(float (&s)[kNTiles][4], RowStats& stats,
                                               float (&correction)[2], float max_slack = kMaxSlack,
                                               float score_scale = 1.f) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float partial_max[kNTiles];
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
      partial_max[t] = max_keeping_nan(s[t][2 * half], s[t][2 * half + 1]);
    float tile_max = tree_max<kNTiles>(partial_max);
    tile_max = max_keeping_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = max_keeping_nan(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    tile_max *= score_scale;
    // A NaN max (a NaN logit) is taken, not kept: the row stays NaN.
    const float tile_new_max = max_keeping_nan(stats.max[half], tile_max);
    const float new_max =
        tile_new_max - stats.max[half] <= max_slack ? stats.max[half] : tile_new_max;
    // A row that has seen only masked keys (and no sink) keeps max -inf: shift by 0 so
    // exp2(-inf - shift) = 0 instead of NaN.
    const float shift = new_max == -INFINITY ? 0.f : new_max;
    // Exactly 1 where the max stayed (a row still at -inf included), so the rescale is skipped.
    correction[half] = new_max == stats.max[half] ? 1.f : fast_exp2(stats.max[half] - shift);
    stats.max[half] = new_max;
    float partial_sum[kNTiles];
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      const float p0 = fast_exp2(fmaf(s[t][2 * half], score_scale, -shift));
      const float p1 = fast_exp2(fmaf(s[t][2 * half + 1], score_scale, -shift));
      s[t][2 * half] = p0;
      s[t][2 * half + 1] = p1;
      partial_sum[t] = p0 + p1;
    }
    stats.sum[half] = stats.sum[half] * correction[half] + tree_sum<kNTiles>(partial_sum);
  }
}

// The same with a fixed max (SoftmaxShift::fixed): S, already shifted, becomes P = exp2(S) and
// the sums absorb it; nothing needs rescaling (`correction` is left unset).
template <int kNTiles>
__device__ __forceinline__ void softmax_update(float (&s)[kNTiles][4], RowStats& stats,
                                               float (&correction)[2], const SoftmaxShift& shift) {
  if (!shift.fixed) {
    softmax_update(s, stats, correction, shift.max_slack, shift.score_scale);
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float partial_sum[kNTiles];
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      const float p0 = fast_exp2(s[t][2 * half]);
      const float p1 = fast_exp2(s[t][2 * half + 1]);
      s[t][2 * half] = p0;
      s[t][2 * half + 1] = p1;
      partial_sum[t] = p0 + p1;
    }
    stats.sum[half] += tree_sum<kNTiles>(partial_sum);
  }
}

template <int kVTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kVTiles][4], const float (&correction)[2]);

// rescale_rows where some row of the warp moved its max (a correction of exactly 1 changes
// nothing; with kMaxSlack most tiles past the first move none). Every lane must call it.
template <int kVTiles>
__device__ __forceinline__ void rescale_rows_if_moved(float (&o)[kVTiles][4],
                                                      const float (&correction)[2]) {
  if (__any_sync(0xffffffffu, correction[0] != 1.f || correction[1] != 1.f))
    rescale_rows(o, correction);
}

template <int kVTiles>
__device__ __forceinline__ void rescale_rows(float (&o)[kVTiles][4], const float (&correction)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int t = 0; t < kVTiles; ++t) {
      o[t][2 * half] *= correction[half];
      o[t][2 * half + 1] *= correction[half];
    }
}

template <int kNTiles, int kVTiles>
__device__ __forceinline__ void online_softmax(float (&s)[kNTiles][4], float (&o)[kVTiles][4],
                                               RowStats& stats, float max_slack) {
  float correction[2];
  softmax_update(s, stats, correction, max_slack);
  rescale_rows_if_moved(o, correction);
}

// Dropout scales what multiplies V, not the normaliser (DESIGN.md §3.7).
template <int kNTiles>
__device__ __forceinline__ void apply_dropout(const FlashForwardParams& p, float (&s)[kNTiles][4],
                                              const uint32_t (&bits)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half)
#pragma unroll
    for (int t = 0; t < kNTiles; ++t) {
      const uint32_t pair = bits[half] >> (2 * t);
      s[t][2 * half] *= pair & 1u ? p.dropout_scale : 0.f;
      s[t][2 * half + 1] *= pair & 2u ? p.dropout_scale : 0.f;
    }
}

// P's 16 keys 16kk..16kk+15 as an m16n8k16 A operand (S tiles 2kk and 2kk + 1).
template <typename Element, int kNTiles>
__device__ __forceinline__ void pack_p_operand(const float (&s)[kNTiles][4], int kk,
                                               uint32_t (&a)[4]) {
  a[0] = ptx::pack2<Element>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = ptx::pack2<Element>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = ptx::pack2<Element>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = ptx::pack2<Element>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Epilogue of one slab: finish the row sums across the quad, normalise, store O and LSE (or
// the split-KV partials).
template <typename Element, int kVTiles>
__device__ __forceinline__ void store_slab(const FlashForwardParams& p,
                                           const FlashBlock<Element>& b,
                                           const float (&o)[kVTiles][4], const RowStats& stats,
                                           int row0, int quad_col) {
  constexpr int kDimV = 8 * kVTiles;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float sum = stats.sum[half];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int i = row0 + 8 * half;
    if (i >= b.seqlen_q) continue;
    // sum = 0: an empty row (o = 0, lse = -inf); a NaN sum (a NaN logit) stays NaN.
    const float inverse = sum == 0.f ? 0.f : 1.f / sum;
    const float lse = sum == 0.f ? -INFINITY : (stats.max[half] + __log2f(sum)) * kLn2;
    if (p.num_splits == 1) {
      const int64_t row = (p.start_q ? p.start_q[b.batch] : 0) + i;
      Element* o_row = static_cast<Element*>(p.o) + b.batch * p.o_batch_stride +
                       row * p.o_row_stride + b.head * p.o_head_stride;
#pragma unroll
      for (int t = 0; t < kVTiles; ++t) {
        const uint32_t pair =
            ptx::pack2<Element>(o[t][2 * half] * inverse, o[t][2 * half + 1] * inverse);
        *reinterpret_cast<uint32_t*>(o_row + 8 * t + 2 * quad_col) = pair;
      }
      if (quad_col == 0)
        p.lse[b.batch * p.lse_batch_stride + b.head * p.lse_head_stride + row] = lse;
    } else {
      const int64_t row =
          ((int64_t(b.split) * p.batch + b.batch) * p.heads_q + b.head) * p.max_seqlen_q + i;
      float* o_row = p.partial_o + row * kDimV;
#pragma unroll
      for (int t = 0; t < kVTiles; ++t)
        *reinterpret_cast<float2*>(o_row + 8 * t + 2 * quad_col) =
            make_float2(o[t][2 * half] * inverse, o[t][2 * half + 1] * inverse);
      if (quad_col == 0) p.partial_lse[row] = lse;
    }
  }
}

}  // namespace dpa::cuda
