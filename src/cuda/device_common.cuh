// Small device helpers shared by every CUDA translation unit: storage conversions, the sink
// logit of DESIGN.md §3.5, and the launch shape of grid-stride elementwise kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace dpa::cuda {

__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(float x) { return x; }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ __half from_float<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ float from_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double from_float<double>(float x) {
  return double(x);
}

// max(a, b) that keeps NaN (fmaxf drops it): a row max over logits with a NaN must be NaN,
// or a row whose logits are all NaN (or NaN among -inf) would read as an empty row
// (docs/decisions.md, non-finite inputs). max.NaN is one instruction on sm_80+, as fmaxf is.
__device__ __forceinline__ float max_keeping_nan(float a, float b) {
  float result;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
  return result;
}

// min(a, b) that keeps NaN (fminf drops it): a clamp that must not turn a NaN into a number.
__device__ __forceinline__ float min_keeping_nan(float a, float b) {
  float result;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(result) : "f"(a), "f"(b));
  return result;
}

// sigma_h in natural-log units: -inf without a sink (softmax_type 0), 0 for off-by-one (1),
// the learnable offset alpha_h (2).
__device__ __forceinline__ float sink_logit(int softmax_type, const float* softmax_offset,
                                            int64_t head) {
  if (softmax_type == 1) return 0.f;
  if (softmax_type == 2) return softmax_offset[head];
  return -INFINITY;
}

// Grid-stride elementwise kernels: blocks of kElementwiseThreads, at most 2^16 blocks (enough
// to fill any current GPU), at least one.
constexpr int kElementwiseThreads = 256;
inline unsigned elementwise_grid(int64_t total) {
  const int64_t blocks = (total + kElementwiseThreads - 1) / kElementwiseThreads;
  return unsigned(blocks < 1 ? 1 : (blocks < 65536 ? blocks : 65536));
}

}  // namespace dpa::cuda
