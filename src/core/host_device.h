// DPA_HOST_DEVICE: a function that CPU and CUDA code share (header-only, inlined in both).
#pragma once

#if defined(__CUDACC__)
#define DPA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DPA_HOST_DEVICE inline
#endif
