// The backward's per-tile math, for both kernel families (docs/cuda_flash.md, "The backward"):
// logits, the cap's derivative, ALiBi and the mask, P and dU from the saved LSE and D, dropout's
// keep bits, on accumulator fragments. The mma.sync pair's query tiles (dq kernel) and key tiles
// (dk/dv kernel, keep masks per 32 queries), then the one-kernel backward's key tiles (64 keys x
// 64 queries, keep words drawn by its producer). Each feature test sits around a loop, never
// inside one: a test per element compiles to a branch per element, which serialises the MUFU
// chains.
#pragma once

#include "core/philox.h"
#include "cuda/flash/flash_backward_params.h"
#include "cuda/flash/flash_forward_kernel.cuh"
#include "cuda/flash/flash_tile_math.cuh"

namespace dpa::cuda {

// ---- The mma.sync pair's tiles (the fragment layout of mma.sync and wgmma accumulators alike: a
// thread holds rows g and g + 8 of a 16-row slab, columns 8t + 2q + {0, 1}). ----

// Raw scores x = q.k (in s) become logits in log2 units before ALiBi and the mask, and
// `derivative` the logit's derivative with respect to u = scale * x relative to the uncapped
// case: 1 - tanh^2 with a cap (the forward's tanh(y) = 1 - 2r, r = softcap_ratio, so
// 1 - t^2 = 4 r (1 - r) without cancellation), else 1. The feature test stays around the loops:
// a test per element compiles to a branch per element, which serialises each element's MUFU
// chain. The mask uses visible_range (DESIGN.md §3) per row, computed once.
template <int kTiles>
__device__ __forceinline__ void backward_logits(const FlashForwardParams& p, float (&s)[kTiles][4],
                                                float (&derivative)[kTiles][4]) {
  if (p.use_softcap) {
    const float exp_scale = softcap_exp_scale(p);
    const float slope = -2.f * p.softcap_log2;
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float r = softcap_ratio(s[t][e], exp_scale);
        derivative[t][e] = 4.f * r * (1.f - r);
        s[t][e] = fmaf(r, slope, p.softcap_log2);
      }
    return;
  }
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      derivative[t][e] = 1.f;
      s[t][e] *= p.scale_log2;
    }
}

// Query rows as fragment rows (the dq kernels): S becomes P (0 where invisible) and
// `derivative` the cap's derivative. `row0` is the thread's first row, `n0` the tile's first key.
// Branch-free passes: logits, ALiBi, then the mask (each row's visible keys computed once).
template <int kNTiles, typename Element>
__device__ __forceinline__ void query_tile_probabilities(
    const FlashForwardParams& p, const FlashBlock<Element>& b, float (&s)[kNTiles][4],
    float (&derivative)[kNTiles][4], int row0, int n0, int quad_col, const float (&lse2)[2],
    bool fully_visible) {
  backward_logits(p, s, derivative);
  if (p.alibi_slopes) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int i = row0 + 8 * (e / 2), j = n0 + 8 * t + 2 * quad_col + (e & 1);
        s[t][e] -= b.alibi_slope * fabsf(float(i + b.diagonal - j));
      }
  }
  if (fully_visible) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = fast_exp2(s[t][e] - lse2[e / 2]);
    return;
  }
  const VisibleRange rows[2] = {visible_range(p, row0, b.seqlen_q, b.seqlen_kv, b.diagonal),
                                visible_range(p, row0 + 8, b.seqlen_q, b.seqlen_kv, b.diagonal)};
#pragma unroll
  for (int t = 0; t < kNTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = n0 + 8 * t + 2 * quad_col + (e & 1);
      const bool visible = j >= rows[e / 2].begin && j < rows[e / 2].end;
      s[t][e] = visible ? fast_exp2(s[t][e] - lse2[e / 2]) : 0.f;
    }
}

// P (in s) becomes dU = P (dP keep / keep_prob - D) (1 - t^2). `keep` as draw_keep_bits.
template <int kNTiles>
__device__ __forceinline__ void query_tile_logit_gradients(
    const FlashForwardParams& p, float (&s)[kNTiles][4], const float (&dp)[kNTiles][4],
    const float (&derivative)[kNTiles][4], const uint32_t (&keep)[2], const float (&delta)[2]) {
  if (p.dropout_threshold != 0) {
#pragma unroll
    for (int t = 0; t < kNTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d_prob =
            (keep[e / 2] >> (2 * t + (e & 1))) & 1u ? dp[t][e] * p.dropout_scale : 0.f;
        s[t][e] = s[t][e] * (d_prob - delta[e / 2]) * derivative[t][e];
      }
    return;
  }
#pragma unroll
  for (int t = 0; t < kNTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[t][e] = s[t][e] * (dp[t][e] - delta[e / 2]) * derivative[t][e];
}

// Keys as fragment rows (the dk/dv kernels) of one (batch, query head).
struct KeyTile {
  int batch, head, seqlen_q, seqlen_kv, diagonal;
  // As loaded from alibi_slopes (natural units), converted only where it is used: the load's
  // latency then ends inside the ALiBi branch. A conversion beside the load made every
  // iteration wait for it, ALiBi or not (ncu, session 25: 4.9% of the d64 backward's stall
  // samples on that one multiply behind a predicated-off load).
  float alibi_slope;
};

// ALiBi on a key-major tile's logits: key key0 + 8 (e / 2), query i0 + 8t + 2 quad_col + (e & 1).
template <int kMTiles>
__device__ __forceinline__ void subtract_key_tile_alibi(const KeyTile& k, float (&s)[kMTiles][4],
                                                        int key0, int i0, int quad_col) {
  const float slope_log2 = k.alibi_slope * kLog2e;
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = key0 + 8 * (e / 2), i = i0 + 8 * t + 2 * quad_col + (e & 1);
      s[t][e] -= slope_log2 * fabsf(float(i + k.diagonal - j));
    }
}

// Dropout keep masks of a warp's 16 keys (from `warp_key0`, a multiple of 8 in the unsharded
// sequence: a CP tile whose keys are not is refused with dropout) against 32 queries from i0:
// lane l draws the two Philox blocks of query i0 + l into masks[half * 32 + l], bit k = key
// warp_key0 + 8 half + k kept. A thread's keys of one query lie in different 8-key blocks in
// this orientation, so drawing per element would cost 8x more. Callers order these writes
// after the previous tile's reads (a barrier) and before this tile's reads (__syncwarp here).
__device__ __forceinline__ void draw_key_tile_keep_masks(const FlashForwardParams& p,
                                                         const KeyTile& k, int i0, int warp_key0,
                                                         int lane, uint8_t* masks) {
  const int64_t global_row = i0 + lane + int64_t(p.q_position[k.batch]);
  const int64_t global_key = warp_key0 + int64_t(p.kv_position[k.batch]);
#pragma unroll 1
  for (int half = 0; half < 2; ++half) {
    const Philox4 block = dropout_block(p.seed, p.offset, k.batch, p.heads_total,
                                        k.head + p.head_offset, global_row, global_key + 8 * half);
    uint32_t mask = 0;
#pragma unroll
    for (int bit = 0; bit < 8; ++bit)
      mask |= (dropout_u16(block, bit) >= p.dropout_threshold ? 1u : 0u) << bit;
    masks[half * 32 + lane] = uint8_t(mask);
  }
  __syncwarp();
}

// S^T becomes P^T (0 where invisible), `derivative` the cap's derivative, `p_dropped` Pd^T;
// `keep` gets bit 4t + e for each kept element. `key0` is the thread's first key, `i0` the
// tile's first query; `lse2` the tile's LSE in log2 units (row_lse_log2) per column; `masks`
// from draw_key_tile_keep_masks (read only with dropout).
template <int kMTiles>
__device__ __forceinline__ void key_tile_probabilities(
    const FlashForwardParams& p, const KeyTile& k, float (&s)[kMTiles][4],
    float (&derivative)[kMTiles][4], float (&p_dropped)[kMTiles][4], uint32_t& keep, int key0,
    int i0, int quad_row, int quad_col, const float* lse2, const uint8_t* masks) {
  static_assert(kMTiles == 4, "32 query columns: one per lane for the keep masks");
  // Branch-free passes (backward_logits): logits, ALiBi, the mask (each query column's visible
  // keys computed once), dropout.
  backward_logits(p, s, derivative);
  if (p.alibi_slopes) subtract_key_tile_alibi(k, s, key0, i0, quad_col);
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int column = 8 * t + 2 * quad_col + c;
      const VisibleRange keys = visible_range(p, i0 + column, k.seqlen_q, k.seqlen_kv, k.diagonal);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 2 * half + c, j = key0 + 8 * half;
        const bool visible = j >= keys.begin && j < keys.end;
        s[t][e] = visible ? fast_exp2(s[t][e] - lse2[column]) : 0.f;
        p_dropped[t][e] = s[t][e];
      }
    }
  keep = 0;
  if (p.dropout_threshold != 0) {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = 8 * t + 2 * quad_col + (e & 1);
        const bool kept = (masks[(e / 2) * 32 + column] >> quad_row) & 1u;
        keep |= (kept ? 1u : 0u) << (4 * t + e);
        p_dropped[t][e] = kept ? s[t][e] * p.dropout_scale : 0.f;
      }
  }
}

// P^T (in s) becomes dU^T = P^T (dP^T keep / keep_prob - D) (1 - t^2); `delta` per column.
template <int kMTiles>
__device__ __forceinline__ void key_tile_logit_gradients(
    const FlashForwardParams& p, float (&s)[kMTiles][4], const float (&dp)[kMTiles][4],
    const float (&derivative)[kMTiles][4], uint32_t keep, const float* delta, int quad_col) {
  if (p.dropout_threshold != 0) {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = 8 * t + 2 * quad_col + (e & 1);
        const float d_prob = (keep >> (4 * t + e)) & 1u ? dp[t][e] * p.dropout_scale : 0.f;
        s[t][e] = s[t][e] * (d_prob - delta[column]) * derivative[t][e];
      }
    return;
  }
#pragma unroll
  for (int t = 0; t < kMTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      s[t][e] = s[t][e] * (dp[t][e] - delta[8 * t + 2 * quad_col + (e & 1)]) * derivative[t][e];
}

// ---- The one-kernel backward's key tiles (flash_backward_sm90_one_kernel.cuh) ----

// `derivative` gets a quarter of the cap's derivative, r (1 - r), for a slab's four ratios r,
// as two fp16 pairs.
__device__ __forceinline__ void pack_quarter_derivatives(const float (&r)[4],
                                                         uint32_t (&derivative)[2]) {
  float quarter_derivative[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) quarter_derivative[e] = fmaf(-r[e], r[e], r[e]);
  derivative[0] = ptx::pack2<__half>(quarter_derivative[0], quarter_derivative[1]);
  derivative[1] = ptx::pack2<__half>(quarter_derivative[2], quarter_derivative[3]);
}

// A slab's four raw scores become the cap's r (softcap_ratio; the logit is c' - 2c' r,
// c' = cap log2 e), and `derivative` gets pack_quarter_derivatives of them.
__device__ __forceinline__ void cap_ratios(const FlashForwardParams& p, float (&x)[4],
                                           uint32_t (&derivative)[2]) {
  const float exp_scale = softcap_exp_scale(p);
#pragma unroll
  for (int e = 0; e < 4; ++e) x[e] = softcap_ratio(x[e], exp_scale);
  pack_quarter_derivatives(x, derivative);
}

// cap_ratios for a tile whose every element is visible: the two elements of one query column
// (keys k and k + 8) share a MUFU.RCP, as the forward's four do (softcap_logits_of_four: the
// MUFU unit bounds the capped tile; a NaN score makes its neighbour NaN, which the query's
// NaN LSE makes of the whole column anyway).
__device__ __forceinline__ void cap_ratios_of_visible_pairs(const FlashForwardParams& p,
                                                            float (&x)[4],
                                                            uint32_t (&derivative)[2]) {
  const float exp_scale = softcap_exp_scale(p);
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    const float near = softcap_denominator(x[c], exp_scale);
    const float far = softcap_denominator(x[c + 2], exp_scale);
    const float both = fast_rcp(near * far);
    x[c] = both * far;
    x[c + 2] = both * near;
  }
  pack_quarter_derivatives(x, derivative);
}

// P^T of a 64-key x kMTiles*8-query tile in place, without dropout: S^T (in s) becomes P^T
// (0 where invisible) and, with a cap, `derivative` a quarter of the cap's derivative,
// r (1 - r) = (1 - t^2) / 4 (fp16 pairs: 32 fp32 registers more would spill; its rounding,
// 2^-11 relative, is 8x below that of dU^T's bf16 operand; below 2^-14, where |u| > ~4.8 c,
// fp16 subnormals keep less, but there the element's dU^T is 2^-12 of the largest; the 4 is
// folded into dP^T - D in key_tile_gradients), while dP^T is still being computed.
// `lse2` per query column (shared memory, 8-byte aligned), `key0` the thread's first key, `i0` the
// first query. `fully_visible`: every (query, key) pair of the tile is visible. The branches are
// uniform and taken once per tile, so each loop carries only its case's arithmetic and no branch (a
// test per element compiles to a branch per element, which serialises the MUFU chains): the visible
// uncapped tile costs one FFMA and one exp2 per element, the visible capped one FMUL, EX2,
// FADD, FMNMX, half an RCP and 1.5 FMUL (cap_ratios_of_visible_pairs), two FFMA and EX2.
template <int kMTiles>
__device__ __forceinline__ void key_tile_probabilities_no_dropout(
    const FlashForwardParams& p, const KeyTile& k, float (&s)[kMTiles][4],
    uint32_t (&derivative)[kMTiles][2], int key0, int i0, int quad_col, const float* lse2,
    bool fully_visible) {
  auto row_lse_pair = [&](int t) {
    return *reinterpret_cast<const float2*>(lse2 + 8 * t + 2 * quad_col);
  };
  if (fully_visible && p.alibi_slopes == nullptr && !p.use_softcap) {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      const float2 lse = row_lse_pair(t);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[t][e] = fast_exp2(fmaf(s[t][e], p.scale_log2, (e & 1) ? -lse.y : -lse.x));
    }
    return;
  }
  if (fully_visible && p.alibi_slopes == nullptr) {
    // logit - lse = c' - 2c' r - lse (c' = cap log2 e).
    const float slope = -2.f * p.softcap_log2;
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      const float2 lse = row_lse_pair(t);
      const float offset[2] = {p.softcap_log2 - lse.x, p.softcap_log2 - lse.y};
      cap_ratios_of_visible_pairs(p, s[t], derivative[t]);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = fast_exp2(fmaf(s[t][e], slope, offset[e & 1]));
    }
    return;
  }
  // A tile that the mask or window crosses, or ALiBi: the same passes, each branch-free, then
  // the ALiBi bias and the mask (each query column's visible keys computed once).
  if (p.use_softcap) {
    const float slope = -2.f * p.softcap_log2;
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      cap_ratios(p, s[t], derivative[t]);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] = fmaf(s[t][e], slope, p.softcap_log2);
    }
  } else {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[t][e] *= p.scale_log2;
  }
  if (p.alibi_slopes) subtract_key_tile_alibi(k, s, key0, i0, quad_col);
#pragma unroll
  for (int t = 0; t < kMTiles; ++t) {
    const float2 lse = row_lse_pair(t);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const VisibleRange keys =
          visible_range(p, i0 + 8 * t + 2 * quad_col + c, k.seqlen_q, k.seqlen_kv, k.diagonal);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int e = 2 * half + c, j = key0 + 8 * half;
        const bool visible = j >= keys.begin && j < keys.end;
        s[t][e] = visible ? fast_exp2(s[t][e] - (c ? lse.y : lse.x)) : 0.f;
      }
    }
  }
}

// A dropout select: a = kept ? a : 0, kept = keep & mask != 0 (one bit set). In PTX because nvcc
// turns the test of a constant bit into a shift, an and and a compare (three SASS instructions
// per bit, session 39's reading of the d128 dropout loop); as `and` then `setp`, ptxas moves the
// tile's bits into predicates with R2P, seven at a time, and both selects of an element share them.
__device__ __forceinline__ void keep_if_bit_set(uint32_t keep, uint32_t mask, float& a) {
  asm("{\n .reg .pred kept;\n .reg .b32 bit;\n and.b32 bit, %1, %2;\n"
      " setp.ne.b32 kept, bit, 0;\n selp.f32 %0, %0, 0f00000000, kept;\n}\n"
      : "+f"(a)
      : "r"(keep), "r"(mask));
}

// dP^T (in dp) becomes dU^T = P^T (dP^T - D) (1 - t^2) = P^T (4 dP^T - 4 D) r (1 - r); `delta`
// per query column; the cap's derivative only with a cap (it is 1 without).
// kDropout: element (t, e) is kept where bit 4 t + e of `keep` is set (draw_query_tile_keep_words):
// dU^T goes through the kept dP^T / keep_prob (`dropout_scale`), and s becomes the kept P^T
// without that factor (Pd^T up to it: the caller scales dv once at the end). Each select tests
// its bit with keep_if_bit_set, right where it is used: tested apart in C++, the compiler kept
// the tile's 32 bits as predicates packed into general registers, three instructions per bit.
template <bool kDropout = false, int kMTiles>
__device__ __forceinline__ void key_tile_gradients(const FlashForwardParams& p,
                                                   float (&s)[kMTiles][4], float (&dp)[kMTiles][4],
                                                   const uint32_t (&derivative)[kMTiles][2],
                                                   int quad_col, const float* delta,
                                                   uint32_t keep = 0u, float dropout_scale = 1.f) {
  static_assert(!kDropout || kMTiles * 4 <= 32, "a thread's keep bits fit one word");
  auto row_delta_pair = [&](int t) {
    return *reinterpret_cast<const float2*>(delta + 8 * t + 2 * quad_col);
  };
  // dU^T's element from P^T's and dP^T's (dP^T times `dp_scale` first), and with dropout P^T's
  // element dropped.
  auto gradient = [&](float& s_element, float& dp_element, int bit, float dp_scale,
                      float minus_delta, float factor) {
    if constexpr (kDropout) keep_if_bit_set(keep, 1u << bit, dp_element);
    dp_element = s_element * fmaf(dp_element, dp_scale, minus_delta) * factor;
    if constexpr (kDropout) keep_if_bit_set(keep, 1u << bit, s_element);
  };
  if (!p.use_softcap) {
#pragma unroll
    for (int t = 0; t < kMTiles; ++t) {
      const float2 d = row_delta_pair(t);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if constexpr (kDropout) {
          gradient(s[t][e], dp[t][e], 4 * t + e, dropout_scale, (e & 1) ? -d.y : -d.x, 1.f);
        } else {
          dp[t][e] = s[t][e] * (dp[t][e] - ((e & 1) ? d.y : d.x));
        }
      }
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < kMTiles; ++t) {
    const float2 d = row_delta_pair(t);
    const float minus_four_delta[2] = {-4.f * d.x, -4.f * d.y};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const uint32_t pair = derivative[t][e / 2];
      const float quarter_derivative = __half2float(
          __ushort_as_half(static_cast<unsigned short>((e & 1) ? pair >> 16 : pair & 0xFFFFu)));
      gradient(s[t][e], dp[t][e], 4 * t + e, 4.f * dropout_scale, minus_four_delta[e & 1],
               quarter_derivative);
    }
  }
}

// Whether every pair of queries [i_first, i_last] and keys [j_first, j_last] is visible
// (DESIGN.md §3): inside both sequences and the window.
__device__ __forceinline__ bool tile_fully_visible(const FlashForwardParams& p, const KeyTile& k,
                                                   int i_first, int i_last, int j_first,
                                                   int j_last) {
  if (i_last >= k.seqlen_q || j_last >= k.seqlen_kv) return false;
  if (p.window_left >= 0 && j_first < i_last + k.diagonal - p.window_left) return false;
  if (p.window_right >= 0 && j_last > i_first + k.diagonal + p.window_right) return false;
  return true;
}

}  // namespace dpa::cuda
