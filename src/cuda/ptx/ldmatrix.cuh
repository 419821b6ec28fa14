// ldmatrix and stmatrix wrappers: four 8x8 16-bit matrices between shared memory and mma
// fragments. Lane l supplies the row address of matrix l / 8, row l % 8 (16 contiguous bytes);
// each lane holds, per matrix, the two elements (row l / 4, cols 2 (l % 4) .. +1) — transposed
// with .trans.
#pragma once

#include <cstdint>

namespace dpa::cuda::ptx {

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&out)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(address));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&out)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(out[0]), "=r"(out[1]), "=r"(out[2]), "=r"(out[3])
               : "r"(address));
}

// sm_90 and later.
__device__ __forceinline__ void stmatrix_x4(uint32_t address, const uint32_t (&in)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(address),
               "r"(in[0]), "r"(in[1]), "r"(in[2]), "r"(in[3])
               : "memory");
}

}  // namespace dpa::cuda::ptx
