// The flash backward kernels (mma.sync, sm_80+): DESIGN.md §4 without O(s^2) memory and
// without atomics, so every run gives the same bits (sm_80 and the head dims without a Hopper
// one-kernel form; on Hopper the one-kernel backward, flash_backward_sm90_one_kernel.cuh, runs
// head dims 64 and 128 with every feature).
//
// Two kernels recompute P from Q, K and the saved LSE, each owning the rows it writes:
// - dq: a block owns 64 query rows of one (batch, head), walks the visible key tiles and
//   accumulates dq = scale * sum_j dU_ij k_j in registers. Its per-tile math is the forward's
//   (S = Q K^T, dP = dO V^T, both in the mma C layout with a thread's rows g and g + 8).
// - dk/dv: a block owns 64 keys of one (batch, KV head), walks every query head of the group
//   and the query tiles that see its keys, and accumulates dv = sum_i Pd_ij dO_i and
//   dk = scale * sum_i dU_ij q_i. It computes the transposed products (S^T = K Q^T,
//   dP^T = V dO^T), so its fragments hold keys as rows and queries as columns; dk and dv then
//   are "P V"-shaped products whose A operand stays in registers. GQA sums over the group
//   inside the block, in a fixed order.
// Computing S and dP in both kernels costs two GEMMs more than FlashAttention-2's single
// kernel (7 instead of 5), and buys the absence of atomics and of a dq accumulator in fp32.
//
// A prepare kernel computes D = rowsum(dO * o) per row and each row's share of the sink
// gradient; the host sums those per head in a fixed order (launch_reduce_dalpha).
#pragma once

#include "core/philox.h"
#include "cuda/fast_divider.h"
#include "cuda/flash/flash_backward_params.h"
#include "cuda/flash/flash_backward_tile_math.cuh"
#include "cuda/flash/flash_forward_kernel.cuh"
#include "cuda/flash/flash_tile_math.cuh"
#include "cuda/flash/flash_tiles.h"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/ldmatrix.cuh"

namespace dpa::cuda {

template <typename ElementT, int kHeadDimQKT, int kHeadDimVT>
struct FlashBackwardTraits {
  using Element = ElementT;
  static constexpr int kHeadDimQK = kHeadDimQKT, kHeadDimV = kHeadDimVT;
  static constexpr bool kWide = flash_backward_wide(kHeadDimQK, kHeadDimV);
  static constexpr int kWarps = 4, kThreads = 128;
  // dq: 64 query rows (one 16-row slab per warp) against key tiles of 64 (32 for wide heads,
  // whose dq accumulator alone is 128 registers).
  static constexpr int kDqBlockM = 64, kDqBlockN = flash_backward_dq_block_n(kHeadDimQK, kHeadDimV);
  // dk/dv: 64 keys against query tiles of 32 (one query per lane for the dropout draws). Wide
  // heads accumulate dk and dv in two launches.
  static constexpr int kDkvBlockN = 64, kDkvBlockM = 32;
  static constexpr bool kDkDvInOneLaunch = !kWide;
  static constexpr int kPad = 8;  // as the forward: conflict-free ldmatrix rows
  static constexpr int kQkStride = kHeadDimQK + kPad, kVStride = kHeadDimV + kPad;
  static constexpr int kStages = 2;
  // Host and device agree on the sizes (flash_tiles.h; the selector checks them against the
  // device's shared memory per block).
  static constexpr int kDqSharedBytes = flash_backward_dq_shared_bytes(kHeadDimQK, kHeadDimV);
  static constexpr int kDkvSharedBytes = flash_backward_dkdv_shared_bytes(kHeadDimQK, kHeadDimV);
  static_assert(kDqSharedBytes == 2 * (kDqBlockM + kStages * kDqBlockN) * (kQkStride + kVStride),
                "dq shared layout");
  static_assert(kDkvSharedBytes ==
                    2 * (kDkvBlockN + kStages * kDkvBlockM) * (kQkStride + kVStride) +
                        kStages * 2 * kDkvBlockM * 4 + kWarps * 2 * kDkvBlockM,
                "dk/dv shared layout");
  static_assert(kDkvBlockM == 32, "one query per lane draws the dropout keep masks");
  static_assert(kHeadDimQK % 16 == 0 && kHeadDimV % 16 == 0, "head dims must be multiples of 16");
  static_assert(kDqSharedBytes <= 163 * 1024 && kDkvSharedBytes <= 163 * 1024,
                "tiles must fit sm_80 shared memory");
};

// acc[kN / 8] += A B^T for this warp's 16 rows of A (row-major, kK columns, at `a_lane`) and
// the kN rows of B (row-major, kK columns, at `b_lane`). Lane addresses as the forward's Q and K.
template <typename Element, int kN, int kK, int kBStride>
__device__ __forceinline__ void mma_rows_by_rows(float (&acc)[kN / 8][4], uint32_t a_lane,
                                                 uint32_t b_lane) {
  static_assert(kN % 16 == 0, "B rows come in pairs of n8 tiles");
  constexpr int kBytes = int(sizeof(Element));
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    ptx::ldmatrix_x4(a, a_lane + kk * 16 * kBytes);
#pragma unroll
    for (int pair = 0; pair < kN / 16; ++pair) {
      uint32_t bk[4];
      ptx::ldmatrix_x4(bk, b_lane + (pair * 16 * kBStride + kk * 16) * kBytes);
      const uint32_t b_even[2] = {bk[0], bk[1]}, b_odd[2] = {bk[2], bk[3]};
      ptx::mma_m16n8k16<Element>(acc[2 * pair], a, b_even);
      ptx::mma_m16n8k16<Element>(acc[2 * pair + 1], a, b_odd);
    }
  }
}

// acc[kD / 8] += F B for fp32 fragments F (16 rows x kK, the mma C layout, rounded to Element
// as the A operand) and B (row-major, kK rows x kD, at `b_lane`, read transposed). The
// forward's O += P V.
template <typename Element, int kK, int kD, int kBStride>
__device__ __forceinline__ void mma_fragments_by_rows(float (&acc)[kD / 8][4],
                                                      const float (&f)[kK / 8][4],
                                                      uint32_t b_lane) {
  static_assert(kD % 16 == 0 && kK % 16 == 0, "16-wide MMA steps");
  constexpr int kBytes = int(sizeof(Element));
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[4];
    pack_p_operand<Element>(f, kk, a);
#pragma unroll
    for (int pair = 0; pair < kD / 16; ++pair) {
      uint32_t bv[4];
      ptx::ldmatrix_x4_trans(bv, b_lane + (kk * 16 * kBStride + pair * 16) * kBytes);
      const uint32_t b_even[2] = {bv[0], bv[1]}, b_odd[2] = {bv[2], bv[3]};
      ptx::mma_m16n8k16<Element>(acc[2 * pair], a, b_even);
      ptx::mma_m16n8k16<Element>(acc[2 * pair + 1], a, b_odd);
    }
  }
}

// Lane addresses (ldmatrix row pointers) of the three operand roles above.
template <typename Element, int kStride>
__device__ __forceinline__ uint32_t a_operand_lane(const Element* rows, int lane) {
  return ptx::shared_address(rows + (lane % 16) * kStride + (lane / 16) * 8);
}
template <typename Element, int kStride>
__device__ __forceinline__ uint32_t b_operand_lane(const Element* rows, int lane) {
  return ptx::shared_address(rows + ((lane / 16) * 8 + lane % 8) * kStride + ((lane / 8) % 2) * 8);
}
template <typename Element, int kStride>
__device__ __forceinline__ uint32_t b_transposed_lane(const Element* rows, int lane) {
  return ptx::shared_address(rows + (lane % 16) * kStride + (lane / 16) * 8);
}

// LSE of query row i as the forward stored it (natural log), -inf for a row past the sequence.
__device__ __forceinline__ float row_lse_stored(const FlashForwardParams& p, int batch, int head,
                                                int i, int seqlen_q) {
  if (i >= seqlen_q) return -INFINITY;
  const int64_t row = (p.start_q ? p.start_q[batch] : 0) + i;
  return p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + row];
}

// A stored LSE in log2 units, +inf where no probability may come out (no row, or a row that
// saw no key and no sink: LSE = -inf), so exp2(s - lse) is 0 there instead of NaN.
__device__ __forceinline__ float lse_log2_of(float lse) {
  return lse == -INFINITY ? INFINITY : lse * kLog2e;
}

__device__ __forceinline__ float row_lse_log2(const FlashForwardParams& p, int batch, int head,
                                              int i, int seqlen_q) {
  return lse_log2_of(row_lse_stored(p, batch, head, i, seqlen_q));
}

__device__ __forceinline__ int64_t row_workspace_index(const FlashForwardParams& p, int batch,
                                                       int head, int i) {
  return (int64_t(batch) * p.heads_q + head) * p.max_seqlen_q + i;
}

// Row i of (batch, head) in the one-kernel family's dq workspace, whose rows per head are rounded
// up to whole 64-row tiles (dq_workspace_rows); times dqk, its first float. A narrow form's tile
// of rows [i0, i0 + 64) starts at row i0's.
__device__ __forceinline__ int64_t dq_workspace_row(const FlashForwardParams& p, int batch,
                                                    int head, int i) {
  return (int64_t(batch) * p.heads_q + head) * dq_workspace_rows(p.max_seqlen_q) + i;
}

// The ticket word (FlashBackwardParams::dq_tickets) of (batch, head)'s 64-row query tile whose
// first row is `first_row` (tickets only at 64-row tiles: flash_backward_dq_takes_tickets).
__device__ __forceinline__ int* dq_ticket_word(const FlashBackwardParams& bp, int batch, int head,
                                               int first_row) {
  return bp.dq_tickets + (int64_t(batch) * bp.fwd.heads_q + head) * bp.dq_tiles_per_head +
         first_row / kOneKernelBackwardBlockM;
}

// Stores fp32 fragments (a slab's rows g and g + 8, kDim columns) times `factor` as Element
// rows: `row_pointer(i)` gives row i's first element, nullptr to skip it.
template <typename Element, int kDim, typename RowPointer>
__device__ __forceinline__ void store_fragment_rows(const float (&acc)[kDim / 8][4], float factor,
                                                    int row0, int quad_col,
                                                    RowPointer row_pointer) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    Element* row = row_pointer(row0 + 8 * half);
    if (row == nullptr) continue;
#pragma unroll
    for (int t = 0; t < kDim / 8; ++t)
      *reinterpret_cast<uint32_t*>(row + 8 * t + 2 * quad_col) =
          ptx::pack2<Element>(acc[t][2 * half] * factor, acc[t][2 * half + 1] * factor);
  }
}

// ---- Block setup and stores shared by every backward kernel family ----

template <int kTiles>
__device__ __forceinline__ void zero_fragments(float (&f)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) f[t][e] = 0.f;
}

// D of query row i (0 outside the sequence).
__device__ __forceinline__ float row_delta_of(const FlashBackwardParams& bp, int batch, int head,
                                              int i, int seqlen_q) {
  return i < seqlen_q ? bp.row_delta[row_workspace_index(bp.fwd, batch, head, i)] : 0.f;
}

// A dq block's LSE (log2 units) and D for a thread's rows row0 and row0 + 8.
template <typename Element>
__device__ __forceinline__ void load_row_statistics(const FlashBackwardParams& bp,
                                                    const FlashBlock<Element>& b, int row0,
                                                    float (&lse2)[2], float (&delta)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = row0 + 8 * half;
    lse2[half] = row_lse_log2(bp.fwd, b.batch, b.head, i, b.seqlen_q);
    delta[half] = row_delta_of(bp, b.batch, b.head, i, b.seqlen_q);
  }
}

// dO rows of a dq block (its first row).
template <typename Element>
__device__ __forceinline__ const Element* block_d_o(const FlashBackwardParams& bp,
                                                    const FlashBlock<Element>& b) {
  const int64_t row = (bp.fwd.start_q ? bp.fwd.start_q[b.batch] : 0) + b.m0;
  return static_cast<const Element*>(bp.d_o) + b.batch * bp.do_batch_stride +
         row * bp.do_row_stride + b.head * bp.do_head_stride;
}

// scale * dq of a thread's rows row0 and row0 + 8 (rows past the sequence skipped).
template <typename Element, int kDimQK>
__device__ __forceinline__ void store_dq_rows(const FlashBackwardParams& bp,
                                              const FlashBlock<Element>& b,
                                              const float (&dq)[kDimQK / 8][4], int row0,
                                              int quad_col) {
  const int64_t q_start = bp.fwd.start_q ? bp.fwd.start_q[b.batch] : 0;
  store_fragment_rows<Element, kDimQK>(dq, bp.scale, row0, quad_col, [&](int i) -> Element* {
    if (i >= b.seqlen_q) return nullptr;
    return static_cast<Element*>(bp.dq) + b.batch * bp.dq_batch_stride +
           (q_start + i) * bp.dq_row_stride + b.head * bp.dq_head_stride;
  });
}

// What a dk/dv block (block_n keys of one batch and KV head) walks: iteration `it` covers the
// block_m-row query tile first_query(it) of query head head(it), over the group's heads and the
// query tiles that see the block's keys (queries_seeing_keys).
struct KeyBlock {
  int batch, kv_head, seqlen_q, seqlen_kv, j0, keys_here, diagonal;
  int block_m, m_begin, m_tiles, group, iterations;
  int64_t q_start, kv_start;
  // Each head's query tiles last first (the deterministic one-kernel backward: set where the
  // block is made, so it folds away in every kernel).
  bool descending = false;
  FastDivider by_m_tiles;  // it / m_tiles without a division per iteration
  __device__ int head(int it) const { return kv_head * group + by_m_tiles.quotient(it); }
  __device__ int first_query(int it) const {
    const int t = it - by_m_tiles.quotient(it) * m_tiles;
    return (m_begin + (descending ? m_tiles - 1 - t : t)) * block_m;
  }
};

// Key block `key_block` of (batch, kv_head); returns false when it has no keys (nothing to do).
__device__ __forceinline__ bool make_key_block(const FlashForwardParams& p, int block_n,
                                               int block_m, KeyBlock& k, int batch, int kv_head,
                                               int key_block) {
  k.batch = batch;
  k.kv_head = kv_head;
  k.seqlen_q = p.seqlen_q[k.batch];
  k.seqlen_kv = p.seqlen_kv[k.batch];
  k.j0 = key_block * block_n;
  if (k.j0 >= k.seqlen_kv) return false;
  k.keys_here = min(block_n, k.seqlen_kv - k.j0);
  k.diagonal = p.diagonal[k.batch];
  const QueryTileSpan tiles = key_block_query_tiles(k.j0, block_n, block_m, k.seqlen_q, k.seqlen_kv,
                                                    k.diagonal, p.window_left, p.window_right);
  k.block_m = block_m;
  k.m_begin = tiles.first;
  k.m_tiles = tiles.last + 1 - tiles.first;
  k.by_m_tiles = FastDivider(max(k.m_tiles, 1));  // no iteration divides by an empty count
  k.group = p.group_size;
  k.iterations = k.m_tiles * k.group;
  k.q_start = p.start_q ? p.start_q[k.batch] : 0;
  k.kv_start = p.start_kv ? p.start_kv[k.batch] : 0;
  return true;
}

// The block of the grid's usual order: key block x of KV head y of batch z.
__device__ __forceinline__ bool make_key_block(const FlashForwardParams& p, int block_n,
                                               int block_m, KeyBlock& k) {
  return make_key_block(p, block_n, block_m, k, blockIdx.z, blockIdx.y, blockIdx.x);
}

// The block's first K (or V) row: `rows` is p.k or p.v with its strides.
template <typename Element>
__device__ __forceinline__ const Element* key_block_rows(const KeyBlock& k, const void* rows,
                                                         int64_t batch_stride, int64_t row_stride,
                                                         int64_t head_stride) {
  return static_cast<const Element*>(rows) + k.batch * batch_stride +
         (k.kv_start + k.j0) * row_stride + k.kv_head * head_stride;
}

// Iteration it's first Q (or dO) row.
template <typename Element>
__device__ __forceinline__ const Element* query_tile_rows(const KeyBlock& k, int it,
                                                          const void* rows, int64_t batch_stride,
                                                          int64_t row_stride, int64_t head_stride) {
  return static_cast<const Element*>(rows) + k.batch * batch_stride +
         (k.q_start + k.first_query(it)) * row_stride + k.head(it) * head_stride;
}

// Iteration it's per-tile context for key_tile_probabilities.
__device__ __forceinline__ KeyTile key_tile_of(const FlashForwardParams& p, const KeyBlock& k,
                                               int it) {
  const int head = k.head(it);
  const float slope = p.alibi_slopes ? p.alibi_slopes[k.batch * p.alibi_batch_stride + head] : 0.f;
  return KeyTile{k.batch, head, k.seqlen_q, k.seqlen_kv, k.diagonal, slope};
}

// factor * acc into a thread's key rows key0 and key0 + 8 of dk (or dv): `out` with its
// strides; keys past the sequence skipped.
template <typename Element, int kDim>
__device__ __forceinline__ void store_key_rows(const KeyBlock& k, const float (&acc)[kDim / 8][4],
                                               float factor, int key0, int quad_col, void* out,
                                               int64_t batch_stride, int64_t row_stride,
                                               int64_t head_stride) {
  store_fragment_rows<Element, kDim>(acc, factor, key0, quad_col, [&](int j) -> Element* {
    if (j >= k.seqlen_kv) return nullptr;
    return static_cast<Element*>(out) + k.batch * batch_stride + (k.kv_start + j) * row_stride +
           k.kv_head * head_stride;
  });
}

// dk = scale * dk_acc and dv = dv_acc for a thread's keys key0 and key0 + 8.
template <typename Element, int kDimQK, int kDimV>
__device__ __forceinline__ void store_key_block_gradients(const FlashBackwardParams& bp,
                                                          const KeyBlock& kb,
                                                          const float (&dk_acc)[kDimQK / 8][4],
                                                          const float (&dv_acc)[kDimV / 8][4],
                                                          int key0, int quad_col) {
  store_key_rows<Element, kDimQK>(kb, dk_acc, bp.scale, key0, quad_col, bp.dk, bp.dk_batch_stride,
                                  bp.dk_row_stride, bp.dk_head_stride);
  store_key_rows<Element, kDimV>(kb, dv_acc, 1.f, key0, quad_col, bp.dv, bp.dv_batch_stride,
                                 bp.dv_row_stride, bp.dv_head_stride);
}

template <typename Traits>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dq_kernel(const __grid_constant__ FlashBackwardParams bp) {
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockM = Traits::kDqBlockM, kBlockN = Traits::kDqBlockN;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kQkStride = Traits::kQkStride, kVStride = Traits::kVStride;
  constexpr int kNTiles = kBlockN / 8;

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* q_shared = reinterpret_cast<Element*>(shared_bytes);  // [kBlockM, kQkStride]
  Element* do_shared = q_shared + kBlockM * kQkStride;           // [kBlockM, kVStride]
  Element* k_stages = do_shared + kBlockM * kVStride;            // 2 x [kBlockN, kQkStride]
  Element* v_stages = k_stages + 2 * kBlockN * kQkStride;        // 2 x [kBlockN, kVStride]

  FlashBlock<Element> b;
  if (!make_flash_block(p, kBlockM, kBlockN, b)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int row0 = b.m0 + warp * 16 + quad_row;  // this thread's rows row0 and row0 + 8

  float lse2[2], delta[2];
  load_row_statistics(bp, b, row0, lse2, delta);
  const Element* d_o = block_d_o(bp, b);
  auto load_kv = [&](int n_block, int stage) {
    const int n0 = n_block * kBlockN;
    load_tile_async<Traits, kBlockN, kDimQK, kQkStride>(k_stages + stage * kBlockN * kQkStride,
                                                        b.k + int64_t(n0) * p.k_row_stride,
                                                        p.k_row_stride, b.seqlen_kv - n0);
    load_tile_async<Traits, kBlockN, kDimV, kVStride>(v_stages + stage * kBlockN * kVStride,
                                                      b.v + int64_t(n0) * p.v_row_stride,
                                                      p.v_row_stride, b.seqlen_kv - n0);
  };
  load_tile_async<Traits, kBlockM, kDimQK, kQkStride>(q_shared, b.q, p.q_row_stride, b.rows_here);
  load_tile_async<Traits, kBlockM, kDimV, kVStride>(do_shared, d_o, bp.do_row_stride, b.rows_here);
  if (b.n_block_begin < b.n_block_end) load_kv(b.n_block_begin, 0);
  ptx::cp_async_commit();

  const uint32_t q_lane =
      a_operand_lane<Element, kQkStride>(q_shared + warp * 16 * kQkStride, lane);
  const uint32_t do_lane =
      a_operand_lane<Element, kVStride>(do_shared + warp * 16 * kVStride, lane);

  float dq_acc[kDimQK / 8][4];
  zero_fragments(dq_acc);

  for (int n_block = b.n_block_begin; n_block < b.n_block_end; ++n_block) {
    const int stage = (n_block - b.n_block_begin) % 2;
    const int n0 = n_block * kBlockN;
    __syncthreads();  // every warp is done with tile n - 1, whose stage is refilled next
    if (n_block + 1 < b.n_block_end) load_kv(n_block + 1, stage ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();  // tile n (and Q, dO) landed for every thread
    const Element* k_tile = k_stages + stage * kBlockN * kQkStride;
    const Element* v_tile = v_stages + stage * kBlockN * kVStride;

    uint32_t keep[2] = {0u, 0u};
    if (p.dropout_threshold != 0) draw_keep_bits<kNTiles>(p, b, row0, n0, quad_col, keep);

    // P (in s) and the cap's derivative.
    float s[kNTiles][4], derivative[kNTiles][4];
    zero_fragments(s);
    mma_rows_by_rows<Element, kBlockN, kDimQK, kQkStride>(
        s, q_lane, b_operand_lane<Element, kQkStride>(k_tile, lane));
    const bool fully_visible = n0 >= b.last_row.begin && n0 + kBlockN <= b.first_row.end;
    query_tile_probabilities(p, b, s, derivative, row0, n0, quad_col, lse2, fully_visible);

    // dP = dO V^T, then dU = P (dP keep / keep_prob - D) (1 - t^2), in s.
    float dp[kNTiles][4];
    zero_fragments(dp);
    mma_rows_by_rows<Element, kBlockN, kDimV, kVStride>(
        dp, do_lane, b_operand_lane<Element, kVStride>(v_tile, lane));
    query_tile_logit_gradients(p, s, dp, derivative, keep, delta);

    // dq += dU K.
    mma_fragments_by_rows<Element, kBlockN, kDimQK, kQkStride>(
        dq_acc, s, b_transposed_lane<Element, kQkStride>(k_tile, lane));
  }
  ptx::cp_async_wait<0>();

  store_dq_rows<Element, kDimQK>(bp, b, dq_acc, row0, quad_col);
}

// kDk / kDv: which of the two gradients this launch accumulates (both, for narrow heads).
template <typename Traits, bool kDk, bool kDv>
__global__ void __launch_bounds__(Traits::kThreads, 1)
    flash_backward_dkdv_kernel(const __grid_constant__ FlashBackwardParams bp) {
  using Element = typename Traits::Element;
  const FlashForwardParams& p = bp.fwd;
  constexpr int kBlockN = Traits::kDkvBlockN, kBlockM = Traits::kDkvBlockM;
  constexpr int kDimQK = Traits::kHeadDimQK, kDimV = Traits::kHeadDimV;
  constexpr int kQkStride = Traits::kQkStride, kVStride = Traits::kVStride;
  constexpr int kMTiles = kBlockM / 8;  // n8 tiles of S^T: query columns

  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Element* k_shared = reinterpret_cast<Element*>(shared_bytes);  // [kBlockN, kQkStride]
  Element* v_shared = k_shared + kBlockN * kQkStride;            // [kBlockN, kVStride]
  Element* q_stages = v_shared + kBlockN * kVStride;             // 2 x [kBlockM, kQkStride]
  Element* do_stages = q_stages + 2 * kBlockM * kQkStride;       // 2 x [kBlockM, kVStride]
  float* lse_stages = reinterpret_cast<float*>(do_stages + 2 * kBlockM * kVStride);  // 2 x kBlockM
  float* delta_stages = lse_stages + 2 * kBlockM;                                    // 2 x kBlockM
  // Per warp, per 8-key block of its 16 keys, per query: bit k = key 8 * half + k is kept.
  uint8_t* keep_masks =
      reinterpret_cast<uint8_t*>(delta_stages + 2 * kBlockM) + (threadIdx.x / 32) * 2 * kBlockM;

  KeyBlock kb;
  if (!make_key_block(p, kBlockN, kBlockM, kb)) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int quad_row = lane / 4, quad_col = lane % 4;
  const int warp_key0 = kb.j0 + warp * 16;
  const int key0 = warp_key0 + quad_row;  // this thread's keys key0 and key0 + 8

  const Element* k_rows =
      key_block_rows<Element>(kb, p.k, p.k_batch_stride, p.k_row_stride, p.k_head_stride);
  const Element* v_rows =
      key_block_rows<Element>(kb, p.v, p.v_batch_stride, p.v_row_stride, p.v_head_stride);
  load_tile_async<Traits, kBlockN, kDimQK, kQkStride>(k_shared, k_rows, p.k_row_stride,
                                                      kb.keys_here);
  load_tile_async<Traits, kBlockN, kDimV, kVStride>(v_shared, v_rows, p.v_row_stride, kb.keys_here);

  // Q, dO and the rows' LSE and D of iteration it.
  auto load_queries = [&](int it, int stage) {
    const int head = kb.head(it), i0 = kb.first_query(it);
    const Element* q_rows =
        query_tile_rows<Element>(kb, it, p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride);
    const Element* do_rows = query_tile_rows<Element>(kb, it, bp.d_o, bp.do_batch_stride,
                                                      bp.do_row_stride, bp.do_head_stride);
    load_tile_async<Traits, kBlockM, kDimQK, kQkStride>(q_stages + stage * kBlockM * kQkStride,
                                                        q_rows, p.q_row_stride, kb.seqlen_q - i0);
    load_tile_async<Traits, kBlockM, kDimV, kVStride>(do_stages + stage * kBlockM * kVStride,
                                                      do_rows, bp.do_row_stride, kb.seqlen_q - i0);
    for (int r = threadIdx.x; r < kBlockM; r += Traits::kThreads) {
      lse_stages[stage * kBlockM + r] = row_lse_log2(p, kb.batch, head, i0 + r, kb.seqlen_q);
      delta_stages[stage * kBlockM + r] = row_delta_of(bp, kb.batch, head, i0 + r, kb.seqlen_q);
    }
  };
  if (kb.iterations > 0) load_queries(0, 0);
  ptx::cp_async_commit();

  const uint32_t k_lane =
      a_operand_lane<Element, kQkStride>(k_shared + warp * 16 * kQkStride, lane);
  const uint32_t v_lane = a_operand_lane<Element, kVStride>(v_shared + warp * 16 * kVStride, lane);

  float dk_acc[kDk ? kDimQK / 8 : 1][4], dv_acc[kDv ? kDimV / 8 : 1][4];
  zero_fragments(dk_acc);
  zero_fragments(dv_acc);

  for (int it = 0; it < kb.iterations; ++it) {
    const int stage = it % 2;
    const int i0 = kb.first_query(it);
    __syncthreads();  // every warp is done with iteration it - 1, whose stage is refilled next
    if (it + 1 < kb.iterations) load_queries(it + 1, stage ^ 1);
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();  // this iteration's Q, dO, LSE and D (and K, V) are in shared memory
    const Element* q_tile = q_stages + stage * kBlockM * kQkStride;
    const Element* do_tile = do_stages + stage * kBlockM * kVStride;
    const float* lse_tile = lse_stages + stage * kBlockM;
    const float* delta_tile = delta_stages + stage * kBlockM;
    const KeyTile key_tile = key_tile_of(p, kb, it);
    // Dropout keep masks, drawn before S exists (as the forward); the loop-top barrier orders
    // them after the previous iteration's reads.
    if (p.dropout_threshold != 0)
      draw_key_tile_keep_masks(p, key_tile, i0, warp_key0, lane, keep_masks);

    // P^T (in s), the cap's derivative, and Pd^T (P with dropout applied) for dv.
    float s[kMTiles][4], derivative[kMTiles][4], p_dropped[kMTiles][4];
    uint32_t keep = 0;
    zero_fragments(s);
    mma_rows_by_rows<Element, kBlockM, kDimQK, kQkStride>(
        s, k_lane, b_operand_lane<Element, kQkStride>(q_tile, lane));
    key_tile_probabilities(p, key_tile, s, derivative, p_dropped, keep, key0, i0, quad_row,
                           quad_col, lse_tile, keep_masks);

    if constexpr (kDv) {
      // dv += Pd^T dO.
      mma_fragments_by_rows<Element, kBlockM, kDimV, kVStride>(
          dv_acc, p_dropped, b_transposed_lane<Element, kVStride>(do_tile, lane));
    }
    if constexpr (kDk) {
      // dP^T = V dO^T, dU^T = P^T (dP^T keep / keep_prob - D) (1 - t^2); dk += dU^T Q.
      float dp[kMTiles][4];
      zero_fragments(dp);
      mma_rows_by_rows<Element, kBlockM, kDimV, kVStride>(
          dp, v_lane, b_operand_lane<Element, kVStride>(do_tile, lane));
      key_tile_logit_gradients(p, s, dp, derivative, keep, delta_tile, quad_col);
      mma_fragments_by_rows<Element, kBlockM, kDimQK, kQkStride>(
          dk_acc, s, b_transposed_lane<Element, kQkStride>(q_tile, lane));
    }
  }
  ptx::cp_async_wait<0>();

  if constexpr (kDk)
    store_key_rows<Element, kDimQK>(kb, dk_acc, bp.scale, key0, quad_col, bp.dk, bp.dk_batch_stride,
                                    bp.dk_row_stride, bp.dk_head_stride);
  if constexpr (kDv)
    store_key_rows<Element, kDimV>(kb, dv_acc, 1.f, key0, quad_col, bp.dv, bp.dv_batch_stride,
                                   bp.dv_row_stride, bp.dv_head_stride);
}

}  // namespace dpa::cuda
