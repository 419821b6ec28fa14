// The flash backward's row passes around its main kernels: before them, each row's D =
// rowsum(dO * o) and sink-gradient share (and the one-kernel family's dq workspace zeroed);
// after the one-kernel backward, dq = scale * that workspace (in row order for the wide form,
// in fragment order for the narrow one). Both only move memory: a row is
// split over a group of threads that each move 16 bytes per access, so that a warp keeps whole
// cache lines in flight (their first form, a warp per row with 2- and 8-byte accesses, kept a
// fraction of that in flight).
#pragma once

#include <cstdint>

#include "cuda/device_common.cuh"
#include "cuda/flash/flash_backward_kernel.cuh"
#include "cuda/ptx/mma.cuh"

namespace dpa::cuda {

// Threads per row: one per 8 columns (16 bytes of a 2-byte element, 32 of fp32), rounded up to a
// power of two so that a row's group is an aligned part of a warp and reduces by shuffles.
constexpr int backward_row_threads(int dim) {
  int threads = 1;
  while (threads * 8 < dim) threads *= 2;
  return threads < 32 ? threads : 32;
}

inline constexpr int kBackwardRowBlockThreads = 256;

// Columns c .. c + 7 of a 2-byte-element row as floats, in one 16-byte load: cuda_flash takes
// only rows that start on 16-byte boundaries (the selector's rule, flash_backend.cc).
template <typename Element>
__device__ __forceinline__ void load_eight(const Element* row, int c, float (&out)[8]) {
  const uint4 bits = *reinterpret_cast<const uint4*>(row + c);
  const Element* e = reinterpret_cast<const Element*>(&bits);
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = to_float(e[k]);
}

// D and the sink-gradient share of each row (0 outside its sequence), and with the one-kernel
// family (bp.dq_accum set) without tickets (bp.dq_tickets null) the row's dq workspace zeroed,
// the rows that round the last tile up included (launched over dq_workspace_rows(max_seqlen_q)
// rows): a group of backward_row_threads(kDimV) threads per row, kBackwardRowBlockThreads per
// block, grid (row blocks, heads, batch).
template <typename Element, int kDimQK, int kDimV>
__global__ void __launch_bounds__(kBackwardRowBlockThreads)
    flash_backward_prepare_kernel(const __grid_constant__ FlashBackwardParams bp) {
  static_assert(kDimV % 8 == 0 && kDimQK % 4 == 0, "whole 16-byte column groups");
  constexpr int kThreads = backward_row_threads(kDimV), kRows = kBackwardRowBlockThreads / kThreads;
  const FlashForwardParams& p = bp.fwd;
  const int batch = blockIdx.z, head = blockIdx.y;
  const int i = blockIdx.x * kRows + int(threadIdx.x) / kThreads;
  const int part = int(threadIdx.x) % kThreads;
  // No lane returns before the shuffles below: a warp's last rows may lie past max_seqlen_q.
  const bool stored = i < p.max_seqlen_q;
  const int64_t index = row_workspace_index(p, batch, head, i);
  if (bp.dq_accum != nullptr && bp.dq_tickets == nullptr && i < dq_workspace_rows(p.max_seqlen_q)) {
    float4* accum =
        reinterpret_cast<float4*>(bp.dq_accum + dq_workspace_row(p, batch, head, i) * kDimQK);
    for (int c = part; c < kDimQK / 4; c += kThreads) accum[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int seqlen_q = p.seqlen_q[batch];
  const int64_t row = (p.start_q ? p.start_q[batch] : 0) + i;
  float delta = 0.f;
  if (stored && i < seqlen_q) {
    const Element* o = static_cast<const Element*>(p.o) + batch * p.o_batch_stride +
                       row * p.o_row_stride + head * p.o_head_stride;
    const Element* d_o = static_cast<const Element*>(bp.d_o) + batch * bp.do_batch_stride +
                         row * bp.do_row_stride + head * bp.do_head_stride;
#pragma unroll
    for (int c = 8 * part; c < kDimV; c += 8 * kThreads) {
      float o8[8], do8[8];
      load_eight(o, c, o8);
      load_eight(d_o, c, do8);
#pragma unroll
      for (int k = 0; k < 8; ++k) delta += o8[k] * do8[k];
    }
  }
  // The group's sum (rows outside a sequence add zeros, so every lane of the group takes part).
#pragma unroll
  for (int offset = kThreads / 2; offset > 0; offset /= 2)
    delta += __shfl_xor_sync(0xffffffffu, delta, offset);
  if (!stored || part != 0) return;
  bp.row_delta[index] = delta;
  if (bp.row_dalpha != nullptr) {
    float share = 0.f;
    if (i < seqlen_q) {
      const float lse = p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + row];
      const float sink = sink_logit(p.softmax_type, p.softmax_offset, head);
      if (lse != -INFINITY) share = -expf(sink - lse) * delta;
    }
    bp.row_dalpha[index] = share;
  }
}

// Columns c .. c + 7 of a dq row, scale times a .. b (fp32) in Element.
template <typename Element>
__device__ __forceinline__ void store_eight(Element* row, int c, float4 a, float4 b, float scale) {
  *reinterpret_cast<uint4*>(row + c) = make_uint4(
      ptx::pack2<Element>(a.x * scale, a.y * scale), ptx::pack2<Element>(a.z * scale, a.w * scale),
      ptx::pack2<Element>(b.x * scale, b.y * scale), ptx::pack2<Element>(b.z * scale, b.w * scale));
}

// Row i of (batch, head)'s dq.
template <typename Element>
__device__ __forceinline__ Element* dq_row(const FlashBackwardParams& bp, int batch, int head,
                                           int i) {
  const int64_t row = (bp.fwd.start_q ? bp.fwd.start_q[batch] : 0) + i;
  return static_cast<Element*>(bp.dq) + batch * bp.dq_batch_stride + row * bp.dq_row_stride +
         head * bp.dq_head_stride;
}

// dq = scale * the wide one-kernel backward's fp32 workspace (rows in row order), for every row
// of every sequence: a group of backward_row_threads(kDimQK) threads per row, 8 columns per
// access.
template <typename Element, int kDimQK>
__global__ void __launch_bounds__(kBackwardRowBlockThreads)
    flash_backward_convert_dq_kernel(const __grid_constant__ FlashBackwardParams bp) {
  static_assert(kDimQK % 8 == 0, "whole 8-column groups");
  constexpr int kThreads = backward_row_threads(kDimQK),
                kRows = kBackwardRowBlockThreads / kThreads;
  const FlashForwardParams& p = bp.fwd;
  const int batch = blockIdx.z, head = blockIdx.y;
  const int i = blockIdx.x * kRows + int(threadIdx.x) / kThreads;
  const int part = int(threadIdx.x) % kThreads;
  if (i >= p.seqlen_q[batch]) return;
  const float* accum = bp.dq_accum + dq_workspace_row(p, batch, head, i) * kDimQK;
  Element* dq = dq_row<Element>(bp, batch, head, i);
#pragma unroll
  for (int c = 8 * part; c < kDimQK; c += 8 * kThreads)
    store_eight(dq, c, *reinterpret_cast<const float4*>(accum + c),
                *reinterpret_cast<const float4*>(accum + c + 4), bp.scale);
}

// dq = scale * the narrow one-kernel backward's fp32 workspace, whose 64-row tiles are in
// fragment order (dq_fragment_offset): a block per tile reads it in order, a float4 per thread
// and pass, puts each float4's two row pairs in place in a row-major shared tile, and then writes
// whole rows, 8 columns per thread and pass. Written straight from the fragments (a thread per
// 16-float chunk, two rows of 8 columns), a warp's 16-byte stores fell on 64 rows, and the pass
// took 2.5x the row-order conversion's time (docs/perf.md, session 40). With tickets
// (bp.dq_tickets), a tile that no key block took was never written: its rows are zeros. Grid
// (tiles per head, heads, batch).
template <typename Element, int kDimQK>
__global__ void __launch_bounds__(kBackwardRowBlockThreads)
    flash_backward_convert_dq_fragments_kernel(const __grid_constant__ FlashBackwardParams bp) {
  constexpr int kTileRows = kOneKernelBackwardBlockM, kThreads = kBackwardRowBlockThreads;
  constexpr int kFloat4s = kTileRows * kDimQK / 4, kRowChunks = kDimQK / 8;
  // 8 floats of padding per row: the four rows a half-warp's 8-byte stores reach (a quad row's
  // 8 columns each) fall in distinct banks.
  constexpr int kStride = kDimQK + 8;
  static_assert(kFloat4s % kThreads == 0 && (kTileRows * kRowChunks) % kThreads == 0,
                "whole passes");
  __shared__ float tile[kTileRows * kStride];
  const FlashForwardParams& p = bp.fwd;
  const int batch = blockIdx.z, head = blockIdx.y, i0 = int(blockIdx.x) * kTileRows;
  const int seqlen_q = p.seqlen_q[batch];
  if (i0 >= seqlen_q) return;
  const float4* accum =
      reinterpret_cast<const float4*>(bp.dq_accum + dq_workspace_row(p, batch, head, i0) * kDimQK);
  const bool taken =
      bp.dq_tickets == nullptr || (*dq_ticket_word(bp, batch, head, i0) & kDqTicketCount) != 0;
  float4 values[kFloat4s / kThreads];
#pragma unroll
  for (int k = 0; k < kFloat4s / kThreads; ++k)
    values[k] = taken ? accum[k * kThreads + threadIdx.x] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
  for (int k = 0; k < kFloat4s / kThreads; ++k) {
    const DqFragmentPosition at = dq_fragment_position(k * kThreads + int(threadIdx.x), kDimQK);
    *reinterpret_cast<float2*>(&tile[at.row * kStride + at.column]) =
        make_float2(values[k].x, values[k].y);
    *reinterpret_cast<float2*>(&tile[(at.row + 8) * kStride + at.column]) =
        make_float2(values[k].z, values[k].w);
  }
  __syncthreads();
#pragma unroll
  for (int k = int(threadIdx.x); k < kTileRows * kRowChunks; k += kThreads) {
    const int row = k / kRowChunks, column = 8 * (k % kRowChunks);
    if (i0 + row >= seqlen_q) break;  // rows grow with k
    const float* from = &tile[row * kStride + column];
    store_eight(dq_row<Element>(bp, batch, head, i0 + row), column,
                *reinterpret_cast<const float4*>(from), *reinterpret_cast<const float4*>(from + 4),
                bp.scale);
  }
}

// The grid of either row pass: kBackwardRowBlockThreads threads per block, a group of
// backward_row_threads(dim) per row.
inline dim3 backward_row_grid(int64_t rows, int heads, int batch, int dim) {
  const int64_t rows_per_block = kBackwardRowBlockThreads / backward_row_threads(dim);
  return dim3(unsigned((rows + rows_per_block - 1) / rows_per_block), unsigned(heads),
              unsigned(batch));
}

}  // namespace dpa::cuda
