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

// *address = v where `store`, else *address += v as red_add_v4: one predicated instruction each,
// so a loop that does either keeps one body.
__device__ __forceinline__ void store_or_add_v4(float4* address, float4 v, bool store) {
  asm volatile(
      "{\n .reg .pred s;\n setp.ne.s32 s, %5, 0;\n"
      " @s st.global.v4.f32 [%0], {%1, %2, %3, %4};\n"
      " @!s red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n}\n" ::"l"(address),
      "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(int(store))
      : "memory");
}

// address[0..1] += v (relaxed, gpu scope; no result). `address` is 8-byte aligned global memory.
__device__ __forceinline__ void red_add_v2(float* address, float2 v) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(address), "f"(v.x), "f"(v.y)
               : "memory");
}

}  // namespace dpa::cuda::ptx
