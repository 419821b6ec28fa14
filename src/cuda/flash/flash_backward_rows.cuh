// The flash backward's row passes around its main kernels: before them, each row's D =
// rowsum(dO * o) and sink-gradient share (and the one-kernel family's dq workspace zeroed);
// after the one-kernel backward, dq = scale * that workspace. Both only move memory: a row is
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
// family (bp.dq_accum set) the row's dq workspace zeroed: a group of backward_row_threads(kDimV)
// threads per row, kBackwardRowBlockThreads per block, grid (row blocks, heads, batch).
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
  if (stored && bp.dq_accum != nullptr) {
    float4* accum = reinterpret_cast<float4*>(bp.dq_accum + index * kDimQK);
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

// dq = scale * the one-kernel backward's fp32 workspace, for every row of every sequence: a
// group of backward_row_threads(kDimQK) threads per row, 8 columns per access.
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
  const float* accum = bp.dq_accum + row_workspace_index(p, batch, head, i) * kDimQK;
  const int64_t row = (p.start_q ? p.start_q[batch] : 0) + i;
  Element* dq = static_cast<Element*>(bp.dq) + batch * bp.dq_batch_stride + row * bp.dq_row_stride +
                head * bp.dq_head_stride;
#pragma unroll
  for (int c = 8 * part; c < kDimQK; c += 8 * kThreads) {
    const float4 a = *reinterpret_cast<const float4*>(accum + c);
    const float4 b = *reinterpret_cast<const float4*>(accum + c + 4);
    *reinterpret_cast<uint4*>(dq + c) =
        make_uint4(ptx::pack2<Element>(a.x * bp.scale, a.y * bp.scale),
                   ptx::pack2<Element>(a.z * bp.scale, a.w * bp.scale),
                   ptx::pack2<Element>(b.x * bp.scale, b.y * bp.scale),
                   ptx::pack2<Element>(b.z * bp.scale, b.w * bp.scale));
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
