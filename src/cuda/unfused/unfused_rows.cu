// Row movers of the unfused backend: packing a strided q/k/v/dO-like tensor for cuBLAS, and
// storing an fp32 GEMM workspace into a strided output in the output dtype.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/unfused/unfused_kernels.h"
#include "cuda/unfused/unfused_row_math.cuh"

namespace dpa::cuda {
namespace unfused {
namespace {

constexpr int kThreads = kElementwiseThreads;

// destination: contiguous [batches, rows, heads, width]; source: the same with strides.
template <typename Element>
__global__ void pack_rows_kernel(const Element* source, RowStrides strides, Element* destination,
                                 int64_t batches, int64_t rows, int64_t heads, int64_t width) {
  const int64_t total = batches * rows * heads * width;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < total;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = n % width;
    const int64_t h = (n / width) % heads;
    const int64_t s = (n / (width * heads)) % rows;
    const int64_t b = n / (width * heads * rows);
    destination[n] = source[b * strides.batch + s * strides.seq + h * strides.head + c];
  }
}

// workspace: [b, heads, max_rows, width] fp32; output rows (b, i < seqlen[b], h) strided.
template <typename T>
__global__ void store_rows_kernel(const float* workspace, int64_t batch, int64_t heads,
                                  int64_t max_rows, int64_t width, const int* seqlen,
                                  const int* start, T* output, RowStrides strides) {
  const int64_t total = batch * heads * max_rows * width;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < total;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = n % width;
    const int64_t i = (n / width) % max_rows;
    const int64_t h = (n / (width * max_rows)) % heads;
    const int64_t b = n / (width * max_rows * heads);
    if (i >= seqlen[b]) continue;
    const int64_t row = start[b] + i;
    output[b * strides.batch + row * strides.seq + h * strides.head + c] =
        from_float<T>(workspace[n]);
  }
}

}  // namespace
}  // namespace unfused

void launch_pack_rows(const void* source, RowStrides source_strides, void* destination,
                      int64_t batches, int64_t rows, int64_t heads, int64_t width,
                      size_t element_bytes, cudaStream_t stream) {
  const int64_t total = batches * rows * heads * width;
  if (total == 0) return;
  const unsigned grid = elementwise_grid(total);
  if (element_bytes == 2) {
    unfused::pack_rows_kernel<uint16_t><<<grid, unfused::kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(source), source_strides, static_cast<uint16_t*>(destination),
        batches, rows, heads, width);
  } else if (element_bytes == 4) {
    unfused::pack_rows_kernel<uint32_t><<<grid, unfused::kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(source), source_strides, static_cast<uint32_t*>(destination),
        batches, rows, heads, width);
  } else {
    throw Error(ErrorCode::kInternal, "", "cuda_unfused: pack of an unsupported element size");
  }
  DPA_CUDA_CHECK_LAUNCH();
}

void launch_store_rows(const float* workspace, int64_t batch, int64_t heads, int64_t max_rows,
                       int64_t width, const int* seqlen, const int* start, void* output,
                       RowStrides output_strides, DType dtype, cudaStream_t stream) {
  const int64_t total = batch * heads * max_rows * width;
  if (total == 0) return;
  const unsigned grid = elementwise_grid(total);
  switch (dtype) {
    case DType::kFloat16:
      unfused::store_rows_kernel<<<grid, unfused::kThreads, 0, stream>>>(
          workspace, batch, heads, max_rows, width, seqlen, start, static_cast<__half*>(output),
          output_strides);
      break;
    case DType::kBFloat16:
      unfused::store_rows_kernel<<<grid, unfused::kThreads, 0, stream>>>(
          workspace, batch, heads, max_rows, width, seqlen, start,
          static_cast<__nv_bfloat16*>(output), output_strides);
      break;
    case DType::kFloat32:
      unfused::store_rows_kernel<<<grid, unfused::kThreads, 0, stream>>>(
          workspace, batch, heads, max_rows, width, seqlen, start, static_cast<float*>(output),
          output_strides);
      break;
    default:
      throw Error(ErrorCode::kInternal, "", "cuda_unfused: unsupported output dtype");
  }
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
