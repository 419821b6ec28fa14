// cp.async copies of K / V / Q tiles into the 128-byte-swizzled shared layout that the wgmma
// kernels and TMA use (chunk c of row r at c ^ (r % 8), ptx::swizzled_offset), from a strided
// tensor or through a page table; rows past the valid ones read as zeros. Shared by the flash
// kernels' producers (the tiles TMA cannot copy) and the KV-cache attention kernel.
#pragma once

#include <cstdint>

#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/wgmma.cuh"

namespace dpa::cuda {

// Copies a kRows x kDim tile into 128-byte-swizzled shared memory from the producer's first
// kThreads threads (the warpgroup, or warp 0 for the tiles that TMA cannot copy); rows at or
// past `valid_rows` read as zeros. When kThreads is a multiple of the 16-byte chunks per row,
// each thread keeps one column and steps over rows, so the loop body is two pointer increments
// (the swizzle phase row % 8 is fixed where the step is a multiple of 8); otherwise a rolled
// loop over chunks. Few registers either way: the producer keeps 40 (24 beside three consumers).
template <typename Element, int kRows, int kDim, int kThreads = 128>
__device__ __forceinline__ void produce_swizzled_tile(uint32_t shared_tile,
                                                      const Element* global_tile,
                                                      int64_t row_stride, int valid_rows) {
  constexpr int kChunksPerRow = kDim / 8;
  const int thread = int(threadIdx.x) % kThreads;
  if constexpr (kThreads % kChunksPerRow == 0) {
    constexpr int kRowStep = kThreads / kChunksPerRow;
    const int column = (thread % kChunksPerRow) * 8;
    int row = thread / kChunksPerRow;
    const Element* source = global_tile + row * row_stride + column;
    const int64_t source_step = kRowStep * row_stride;
#pragma unroll 1
    for (; row < kRows; row += kRowStep, source += source_step) {
      const bool valid = row < valid_rows;
      ptx::cp_async_16(shared_tile + ptx::swizzled_offset(kRows, row, column),
                       valid ? source : global_tile, valid);
    }
  } else {
#pragma unroll 1
    for (int chunk = thread; chunk < kRows * kChunksPerRow; chunk += kThreads) {
      const int row = chunk / kChunksPerRow;
      const int column = (chunk % kChunksPerRow) * 8;
      const bool valid = row < valid_rows;
      const Element* source = valid ? global_tile + row * row_stride + column : global_tile;
      ptx::cp_async_16(shared_tile + ptx::swizzled_offset(kRows, row, column), source, valid);
    }
  }
}

// The same for kRows keys n0.. of a paged K or V (FlashForwardParams::block_table): each row's
// page comes from the sequence's table row `pages`; `head_base` is the head's column of page 0.
// Rows past the sequence read no table entry (they may have no page).
template <typename Element, int kRows, int kDim, int kThreads = 128>
__device__ __forceinline__ void produce_paged_tile(uint32_t shared_tile, const Element* head_base,
                                                   int64_t page_stride, int64_t row_stride,
                                                   const int* pages, int page_shift, int n0,
                                                   int valid_rows) {
  constexpr int kChunksPerRow = kDim / 8;
  const int in_page = (1 << page_shift) - 1;
  auto copy_chunk = [&](int row, int column) {
    const bool valid = row < valid_rows;
    const Element* source = head_base;
    if (valid) {
      const int key = n0 + row;
      source += int64_t(pages[key >> page_shift]) * page_stride +
                int64_t(key & in_page) * row_stride + column;
    }
    ptx::cp_async_16(shared_tile + ptx::swizzled_offset(kRows, row, column), source, valid);
  };
  const int thread = int(threadIdx.x) % kThreads;
  if constexpr (kThreads % kChunksPerRow == 0) {  // each thread keeps one column
    constexpr int kRowStep = kThreads / kChunksPerRow;
    const int column = (thread % kChunksPerRow) * 8;
#pragma unroll 1
    for (int row = thread / kChunksPerRow; row < kRows; row += kRowStep) copy_chunk(row, column);
  } else {
#pragma unroll 1
    for (int chunk = thread; chunk < kRows * kChunksPerRow; chunk += kThreads)
      copy_chunk(chunk / kChunksPerRow, (chunk % kChunksPerRow) * 8);
  }
}

}  // namespace dpa::cuda
