// Thin wrappers over the tensor-core PTX we use (sm_80+): mma.sync m16n8k16 with fp32
// accumulation, for fp16 and bf16 operands.
//
// Fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4, t = lane % 4:
//   A (16x16, row-major) 4 x b32: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
//                                 a3 = (g+8, 2t+8..)
//   B (16x8, "col")      2 x b32: b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C (16x8) fp32        4 x f32: c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dpa::cuda::ptx {

template <typename Element>
struct MmaOp;

template <>
struct MmaOp<__half> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

template <>
struct MmaOp<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
};

// c += a * b for one m16n8k16 tile.
template <typename Element>
__device__ __forceinline__ void mma_m16n8k16(float (&c)[4], const uint32_t (&a)[4],
                                             const uint32_t (&b)[2]) {
  MmaOp<Element>::run(c, a, b);
}

// Packs two fp32 values into one b32 register of two 16-bit elements (low half = first).
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float first, float second);

template <>
__device__ __forceinline__ uint32_t pack2<__half>(float first, float second) {
  __half2 pair = __floats2half2_rn(first, second);
  return *reinterpret_cast<uint32_t*>(&pair);
}

template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float first, float second) {
  __nv_bfloat162 pair = __floats2bfloat162_rn(first, second);
  return *reinterpret_cast<uint32_t*>(&pair);
}

}  // namespace dpa::cuda::ptx
