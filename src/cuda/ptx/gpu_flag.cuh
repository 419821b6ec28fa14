// Flags between thread blocks at GPU scope (sm_70+): an acquiring load and a releasing store,
// for the deterministic one-kernel backward's ordered dq reductions.
#pragma once

namespace dpa::cuda::ptx {

__device__ __forceinline__ int load_acquire_gpu(const int* flag) {
  int value;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(value) : "l"(flag) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_gpu(int* flag, int value) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(flag), "r"(value) : "memory");
}

}  // namespace dpa::cuda::ptx
