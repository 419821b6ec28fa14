// Thin wrappers over the vector reductions into global memory (sm_90): the one-kernel backward's
// dq accumulation in fp32. Only compiled into sm_90a code.
#pragma once

namespace dpa::cuda::ptx {

// address[0..3] += v (relaxed, gpu scope; no result). `address` is 16-byte aligned global
// memory.
__device__ __forceinline__ void red_add_v4(float* address, float4 v) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(address), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
}

__device__ __forceinline__ void red_add_v4(float4* address, float4 v) {
  red_add_v4(reinterpret_cast<float*>(address), v);
}

// address[0..1] += v (relaxed, gpu scope; no result). `address` is 8-byte aligned global memory.
__device__ __forceinline__ void red_add_v2(float* address, float2 v) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(v.x), "f"(v.y)
               : "memory");
}

}  // namespace dpa::cuda::ptx
