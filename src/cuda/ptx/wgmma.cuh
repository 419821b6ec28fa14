// Thin wrappers over Hopper's warpgroup MMA (sm_90a): wgmma.mma_async with fp32 accumulators,
// its fences, and the shared-memory matrix descriptor. Only compiled into sm_90a code.
//
// A warpgroup (4 consecutive warps, 128 threads) computes D(64 x N) += A(64 x 16) B(16 x N).
// Accumulator layout: warp w of the group owns rows 16w..16w+15, and within the warp the
// fragment is mma.sync's C layout per n8 tile: d[t][0..1] = (row g, cols 8t + 2q + {0,1}),
// d[t][2..3] = (row g + 8, same cols), g = lane / 4, q = lane % 4. A from registers has
// mma.sync's m16n8k16 A layout per warp, so S accumulators convert to P operands in place.
//
// Shared-memory operands use the 128-byte swizzle: a tile is stored as blocks of 64 columns
// (128 bytes per row), rows 128 bytes apart, and the 16-byte chunk c of row r sits at chunk
// c ^ (r % 8). Each block must start on a 1024-byte boundary.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/mbarrier.cuh"  // fence_proxy_async_shared

namespace dpa::cuda::ptx {

// Byte offset of element (row, column) in a 128-byte-swizzled tile of `rows` rows (16-bit
// elements; `column` a multiple of 8).
__host__ __device__ constexpr uint32_t swizzled_offset(int rows, int row, int column) {
  const int block = column / 64, chunk = (column % 64) / 8;
  return uint32_t(block * rows * 128 + row * 128 + ((chunk ^ (row % 8)) << 4));
}

// Shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") with 128-byte swizzle.
// K-major operands: `leading_bytes` is unused (16); `stride_bytes` = 1024 (8 rows of 128 B).
// MN-major operands: `leading_bytes` = distance between 64-column blocks along MN,
// `stride_bytes` = 1024 (distance between groups of 8 rows along K).
__device__ __forceinline__ uint64_t smem_descriptor(uint32_t address, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  uint64_t descriptor = (address & 0x3FFFFu) >> 4;
  descriptor |= uint64_t((leading_bytes & 0x3FFFFu) >> 4) << 16;
  descriptor |= uint64_t((stride_bytes & 0x3FFFFu) >> 4) << 32;
  descriptor |= uint64_t(1) << 62;  // 128-byte swizzle
  return descriptor;
}

// `descriptor` with its start address moved by `bytes` (a multiple of 16). The address field
// (bits 0-13, in 16-byte units) cannot carry into the next field while the address stays in
// shared memory (< 256 KiB), so one 32-bit add of the low word does it: a kernel builds a
// descriptor once and advances it per wgmma by constants, instead of masking and shifting
// each address again (five uniform instructions per wgmma, as FlashAttention-3 avoids too).
__device__ __forceinline__ uint64_t advance_descriptor(uint64_t descriptor, uint32_t bytes) {
  const uint32_t low = uint32_t(descriptor) + (bytes >> 4);
  return (descriptor & 0xFFFFFFFF00000000ull) | low;
}

// Orders this thread's register writes before the next wgmma reads them (accumulators that
// ordinary code scaled, A operands just packed).
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulator registers across an
// asynchronous wgmma that is still in flight.
template <int kTiles>
__device__ __forceinline__ void fence_accumulators(float (&d)[kTiles][4]) {
#pragma unroll
  for (int t = 0; t < kTiles; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[t][e])::"memory");
}

// The same for A-operand registers that an in-flight wgmma still reads.
template <int kSteps>
__device__ __forceinline__ void fence_registers(uint32_t (&a)[kSteps][4]) {
#pragma unroll
  for (int k = 0; k < kSteps; ++k)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[k][e])::"memory");
}

template <typename Element, int kN>
struct WgmmaSharedShared;
template <typename Element, int kN>
struct WgmmaRegisterShared;
template <typename Element, int kN>
struct WgmmaSharedSharedMnMajor;
template <typename Element, int kN>
struct WgmmaSharedSharedBMnMajor;

#include "cuda/ptx/wgmma_ops.inc"

// d (64 x kN) (+)= A B with A (64 x 16, K-major) and B (kN x 16, K-major) in shared memory.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss(float (&d)[kN / 8][4], uint64_t a_descriptor,
                                         uint64_t b_descriptor, bool accumulate) {
  WgmmaSharedShared<Element, kN>::run(d, a_descriptor, b_descriptor, accumulate);
}

// d (64 x kN) (+)= A B with A (64 x 16) and B (16 x kN) both MN-major in shared memory (each
// stored with its K dimension along the rows; mn_major descriptors).
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss_mn_major(float (&d)[kN / 8][4], uint64_t a_descriptor,
                                                  uint64_t b_descriptor, bool accumulate) {
  WgmmaSharedSharedMnMajor<Element, kN>::run(d, a_descriptor, b_descriptor, accumulate);
}

// d (64 x kN) (+)= A B with A (64 x 16, K-major) and B (16 x kN, MN-major) in shared memory.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_ss_b_mn_major(float (&d)[kN / 8][4], uint64_t a_descriptor,
                                                    uint64_t b_descriptor, bool accumulate) {
  WgmmaSharedSharedBMnMajor<Element, kN>::run(d, a_descriptor, b_descriptor, accumulate);
}

// d (64 x kN) (+)= A B with A in registers and B (16 x kN, MN-major) in shared memory.
template <typename Element, int kN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kN / 8][4], const uint32_t (&a)[4],
                                         uint64_t b_descriptor, bool accumulate) {
  WgmmaRegisterShared<Element, kN>::run(d, a, b_descriptor, accumulate);
}

}  // namespace dpa::cuda::ptx
