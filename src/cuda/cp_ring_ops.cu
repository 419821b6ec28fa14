#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/cp_ring_ops.h"
#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "dpa/error.h"

namespace dpa::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;

cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Four consecutive storage elements, loaded and stored as one 8-byte access.
template <typename T>
struct alignas(8) Four {
  T v[4];
};

// The first element of row `row` (batch-major) of `block`; the pointer argument names the type.
template <typename T>
__device__ __forceinline__ T* row_start(const RowBlock& block, T*, int64_t row) {
  return static_cast<T*>(block.data) + (row / block.rows) * block.batch_stride +
         (row % block.rows) * block.row_stride;
}

// One block per row (grid-stride over rows), threads across the row: index arithmetic once
// per row, and with `vectorized` (width and row starts multiples of 4 elements) 16-byte fp32
// and 8-byte storage accesses.
template <typename T>
__global__ void accumulate_kernel(RowBlock acc, RowBlock tile, bool vectorized) {
  for (int64_t row = blockIdx.x; row < acc.batch * acc.rows; row += gridDim.x) {
    float* a = row_start(acc, static_cast<float*>(nullptr), row);
    const T* x = row_start(tile, static_cast<T*>(nullptr), row);
    if (vectorized) {
      for (int64_t c = 4 * int64_t(threadIdx.x); c < acc.width; c += 4 * int64_t(blockDim.x)) {
        float4 sum = *reinterpret_cast<const float4*>(a + c);
        const Four<T> add = *reinterpret_cast<const Four<T>*>(x + c);
        sum.x += to_float(add.v[0]);
        sum.y += to_float(add.v[1]);
        sum.z += to_float(add.v[2]);
        sum.w += to_float(add.v[3]);
        *reinterpret_cast<float4*>(a + c) = sum;
      }
    } else {
      for (int64_t c = threadIdx.x; c < acc.width; c += blockDim.x) a[c] += to_float(x[c]);
    }
  }
}

template <typename T>
__global__ void convert_kernel(RowBlock dst, RowBlock src, bool vectorized) {
  for (int64_t row = blockIdx.x; row < dst.batch * dst.rows; row += gridDim.x) {
    T* out = row_start(dst, static_cast<T*>(nullptr), row);
    const float* in = row_start(src, static_cast<float*>(nullptr), row);
    if (vectorized) {
      for (int64_t c = 4 * int64_t(threadIdx.x); c < dst.width; c += 4 * int64_t(blockDim.x)) {
        const float4 value = *reinterpret_cast<const float4*>(in + c);
        Four<T> four;
        four.v[0] = from_float<T>(value.x);
        four.v[1] = from_float<T>(value.y);
        four.v[2] = from_float<T>(value.z);
        four.v[3] = from_float<T>(value.w);
        *reinterpret_cast<Four<T>*>(out + c) = four;
      }
    } else {
      for (int64_t c = threadIdx.x; c < dst.width; c += blockDim.x) out[c] = from_float<T>(in[c]);
    }
  }
}

__device__ __forceinline__ float log_add_exp(float a, float b) {
  if (a == -INFINITY) return b;
  if (b == -INFINITY) return a;
  return fmaxf(a, b) + log1pf(expf(-fabsf(a - b)));
}

// One warp per (batch, row, head) of `block`; returns false past the end.
struct RowItem {
  int64_t b, t, h;
};
__device__ __forceinline__ RowItem row_item(int64_t n, int64_t rows, int64_t heads) {
  return {n / (heads * rows), (n / heads) % rows, n % heads};
}

template <typename T>
__global__ void merge_kernel(RowBlock o_acc, float* lse_acc, int64_t lse_rows,
                             int64_t lse_first_row, RowBlock o_tile, const float* lse_tile,
                             int64_t heads) {
  const int lane = threadIdx.x % 32;
  const int64_t dv = o_acc.width / heads;
  const int64_t items = o_acc.batch * o_acc.rows * heads;
  for (int64_t n = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; n < items;
       n += int64_t(gridDim.x) * blockDim.x / 32) {
    const RowItem r = row_item(n, o_acc.rows, heads);
    float* lse = lse_acc + (r.b * heads + r.h) * lse_rows + lse_first_row + r.t;
    const float tile_lse = lse_tile[(r.b * heads + r.h) * o_acc.rows + r.t];
    // No visible key in the tile: nothing to merge (and its o, which should be 0, is not read,
    // as on the host).
    if (tile_lse == -INFINITY) continue;
    const float old_lse = *lse;
    const float merged = log_add_exp(old_lse, tile_lse);
    const float keep = old_lse == -INFINITY ? 0.f : expf(old_lse - merged);
    const float take = tile_lse == -INFINITY ? 0.f : expf(tile_lse - merged);
    float* acc = static_cast<float*>(o_acc.data) + r.b * o_acc.batch_stride +
                 r.t * o_acc.row_stride + r.h * dv;
    const T* tile = static_cast<const T*>(o_tile.data) + r.b * o_tile.batch_stride +
                    r.t * o_tile.row_stride + r.h * dv;
    for (int64_t c = lane; c < dv; c += 32)
      acc[c] = (keep == 0.f ? 0.f : acc[c] * keep) + take * to_float(tile[c]);
    __syncwarp();  // every lane has read the old LSE
    if (lane == 0) *lse = merged;
  }
}

template <typename T>
__global__ void finalize_kernel(RowBlock o, float* lse_out, RowBlock o_acc, const float* lse_acc,
                                int64_t heads, int softmax_type, const float* offsets) {
  const int lane = threadIdx.x % 32;
  const int64_t dv = o.width / heads;
  const int64_t items = o.batch * o.rows * heads;
  for (int64_t n = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; n < items;
       n += int64_t(gridDim.x) * blockDim.x / 32) {
    const RowItem r = row_item(n, o.rows, heads);
    const int64_t lse_index = (r.b * heads + r.h) * o.rows + r.t;
    const float row_lse = lse_acc[lse_index];
    const float final_lse = log_add_exp(row_lse, sink_logit(softmax_type, offsets, r.h));
    const float scale = row_lse == -INFINITY ? 0.f : expf(row_lse - final_lse);
    const float* acc = static_cast<const float*>(o_acc.data) + r.b * o_acc.batch_stride +
                       r.t * o_acc.row_stride + r.h * dv;
    T* out = static_cast<T*>(o.data) + r.b * o.batch_stride + r.t * o.row_stride + r.h * dv;
    for (int64_t c = lane; c < dv; c += 32)
      out[c] = from_float<T>(scale == 0.f ? 0.f : acc[c] * scale);
    if (lane == 0) lse_out[lse_index] = final_lse;
  }
}

// One block per head; warp w takes rows w, w + warps, ... in order, then the block sums the
// warps in order: a fixed reduction order.
constexpr int kSinkWarps = 16;
template <typename T>
__global__ void sink_gradient_kernel(float* dalpha, RowBlock o, RowBlock d_o, const float* lse,
                                     int64_t heads, const float* offsets) {
  __shared__ float warp_sums[kSinkWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t h = blockIdx.x, dv = o.width / heads;
  const float sigma = offsets[h];
  float sum = 0.f;
  for (int64_t n = warp; n < o.batch * o.rows; n += kSinkWarps) {
    const int64_t b = n / o.rows, t = n % o.rows;
    const T* o_row = static_cast<const T*>(o.data) + b * o.batch_stride + t * o.row_stride + h * dv;
    const T* do_row =
        static_cast<const T*>(d_o.data) + b * d_o.batch_stride + t * d_o.row_stride + h * dv;
    float d = 0.f;
    for (int64_t c = lane; c < dv; c += 32) d += to_float(o_row[c]) * to_float(do_row[c]);
    for (int offset = 16; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffffu, d, offset);
    const float row_lse = lse[(b * heads + h) * o.rows + t];
    if (row_lse != -INFINITY) sum -= expf(sigma - row_lse) * d;
  }
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kSinkWarps; ++w) total += warp_sums[w];
    dalpha[h] = total;
  }
}

struct BiasStrides {
  int64_t v[4];
};

__global__ void add_tile_bias_gradient_kernel(float* out, BiasStrides strides, const float* tile,
                                              int64_t batch, int64_t heads, int64_t rows,
                                              int64_t cols, const int64_t* sequences,
                                              int64_t head_offset) {
  const int64_t n = int64_t(heads) * rows * cols;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = e / (rows * cols), i = (e / cols) % rows, j = e % cols;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t* s = sequences + 4 * b;
      if (i >= s[0] || j >= s[1]) continue;
      out[b * strides.v[0] + (h + head_offset) * strides.v[1] + (i + s[2]) * strides.v[2] +
          (j + s[3]) * strides.v[3]] += tile[((b * heads + h) * rows + i) * cols + j];
    }
  }
}

__global__ void copy_strided_kernel(float* dst, int64_t dst0, int64_t dst1, const float* src,
                                    int64_t src0, int64_t src1, int64_t extent0, int64_t extent1) {
  const int64_t n = extent0 * extent1;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / extent1, j = e % extent1;
    dst[i * dst0 + j * dst1] = src[i * src0 + j * src1];
  }
}

template <typename T>
__global__ void sum_arrays_kernel(T* out, const T* first, int inputs, int64_t input_stride,
                                  int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    T sum = first[i];
    for (int r = 1; r < inputs; ++r) sum += first[r * input_stride + i];
    out[i] = sum;
  }
}

__global__ void fill_kernel(float* data, float value, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    data[i] = value;
}

unsigned warp_grid(int64_t items) {
  const int64_t blocks = (items + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return unsigned(blocks < 1 ? 1 : (blocks < 65536 ? blocks : 65536));
}

// Calls f(T{}) with T the element type of `dtype`: fp16 or bf16 (the ring's storage), or fp32
// (the device-resident general algorithms also sum fp32 gradients and take fp32 tiles).
template <typename F>
void with_storage_type(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat16:
      return f(__half{});
    case DType::kBFloat16:
      return f(__nv_bfloat16{});
    case DType::kFloat32:
      return f(float{});
    default:
      throw Error(ErrorCode::kInternal, "dtype", "CP device rows are fp16, bf16 or fp32");
  }
}

// Whether every row of both blocks starts on a multiple of 4 elements of a 16-byte aligned
// (fp32) or 8-byte aligned (storage) base, with a width of a multiple of 4.
bool vectorizable(const RowBlock& fp32, const RowBlock& storage) {
  auto aligned = [](const RowBlock& b, size_t alignment) {
    return reinterpret_cast<uintptr_t>(b.data) % alignment == 0 && b.batch_stride % 4 == 0 &&
           b.row_stride % 4 == 0;
  };
  return fp32.width % 4 == 0 && aligned(fp32, 16) && aligned(storage, 8);
}

constexpr int kRowThreads = 256;
unsigned row_grid(int64_t rows) { return unsigned(rows < 1 ? 1 : (rows < 32768 ? rows : 32768)); }

}  // namespace

void accumulate_rows(const RowBlock& acc, const RowBlock& tile, DType tile_dtype, void* stream) {
  const int64_t rows = acc.batch * acc.rows;
  if (rows == 0 || acc.width == 0) return;
  const bool vectorized = vectorizable(acc, tile);
  with_storage_type(tile_dtype, [&](auto t) {
    accumulate_kernel<decltype(t)>
        <<<row_grid(rows), kRowThreads, 0, as_stream(stream)>>>(acc, tile, vectorized);
  });
  DPA_CUDA_CHECK_LAUNCH();
}

void convert_rows(const RowBlock& dst, DType dst_dtype, const RowBlock& src, void* stream) {
  const int64_t rows = dst.batch * dst.rows;
  if (rows == 0 || dst.width == 0) return;
  if (dst_dtype == DType::kFloat64) {  // an fp64 bias gradient (the only fp64 rows)
    convert_kernel<double><<<row_grid(rows), kRowThreads, 0, as_stream(stream)>>>(dst, src, false);
    DPA_CUDA_CHECK_LAUNCH();
    return;
  }
  const bool vectorized = vectorizable(src, dst);
  with_storage_type(dst_dtype, [&](auto t) {
    convert_kernel<decltype(t)>
        <<<row_grid(rows), kRowThreads, 0, as_stream(stream)>>>(dst, src, vectorized);
  });
  DPA_CUDA_CHECK_LAUNCH();
}

void merge_partial_rows(const RowBlock& o_acc, float* lse_acc, int64_t lse_rows,
                        int64_t lse_first_row, const RowBlock& o_tile, DType tile_dtype,
                        const float* lse_tile, int64_t heads, void* stream) {
  const int64_t items = o_acc.batch * o_acc.rows * heads;
  if (items == 0) return;
  with_storage_type(tile_dtype, [&](auto t) {
    merge_kernel<decltype(t)><<<warp_grid(items), 32 * kWarpsPerBlock, 0, as_stream(stream)>>>(
        o_acc, lse_acc, lse_rows, lse_first_row, o_tile, lse_tile, heads);
  });
  DPA_CUDA_CHECK_LAUNCH();
}

void finalize_forward_rows(const RowBlock& o, DType dtype, float* lse, const RowBlock& o_acc,
                           const float* lse_acc, int64_t heads, int softmax_type,
                           const float* offsets, void* stream) {
  const int64_t items = o.batch * o.rows * heads;
  if (items == 0) return;
  with_storage_type(dtype, [&](auto t) {
    finalize_kernel<decltype(t)><<<warp_grid(items), 32 * kWarpsPerBlock, 0, as_stream(stream)>>>(
        o, lse, o_acc, lse_acc, heads, softmax_type, offsets);
  });
  DPA_CUDA_CHECK_LAUNCH();
}

void sink_gradient(float* dalpha, const RowBlock& o, const RowBlock& d_o, DType dtype,
                   const float* lse, int64_t heads, const float* offsets, void* stream) {
  if (heads == 0) return;
  with_storage_type(dtype, [&](auto t) {
    sink_gradient_kernel<decltype(t)><<<unsigned(heads), 32 * kSinkWarps, 0, as_stream(stream)>>>(
        dalpha, o, d_o, lse, heads, offsets);
  });
  DPA_CUDA_CHECK_LAUNCH();
}

void copy_lse_rows(float* dst, const float* src, int64_t planes, int64_t src_rows,
                   int64_t first_row, int64_t rows, void* stream) {
  if (planes == 0 || rows == 0) return;
  DPA_CUDA_CHECK(cudaMemcpy2DAsync(dst, size_t(rows) * sizeof(float), src + first_row,
                                   size_t(src_rows) * sizeof(float), size_t(rows) * sizeof(float),
                                   size_t(planes), cudaMemcpyDeviceToDevice, as_stream(stream)));
}

void add_tile_bias_gradient(float* out, const int64_t (&strides)[4], const float* tile,
                            int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                            const int64_t* sequences, int64_t head_offset, void* stream) {
  const int64_t n = heads * rows * cols;
  if (n == 0 || batch == 0) return;
  const BiasStrides s{{strides[0], strides[1], strides[2], strides[3]}};
  add_tile_bias_gradient_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, as_stream(stream)>>>(
      out, s, tile, batch, heads, rows, cols, sequences, head_offset);
  DPA_CUDA_CHECK_LAUNCH();
}

void copy_strided_f32(float* dst, const int64_t (&dst_strides)[2], const float* src,
                      const int64_t (&src_strides)[2], int64_t extent0, int64_t extent1,
                      void* stream) {
  const int64_t n = extent0 * extent1;
  if (n == 0) return;
  copy_strided_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, as_stream(stream)>>>(
      dst, dst_strides[0], dst_strides[1], src, src_strides[0], src_strides[1], extent0, extent1);
  DPA_CUDA_CHECK_LAUNCH();
}

void fill_f32(float* data, float value, int64_t n, void* stream) {
  if (n == 0) return;
  fill_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, as_stream(stream)>>>(data, value, n);
  DPA_CUDA_CHECK_LAUNCH();
}

void sum_arrays(void* out, const void* first, int inputs, int64_t input_stride, int64_t n,
                DType dtype, void* stream) {
  if (n == 0) return;
  if (dtype == DType::kFloat64) {
    sum_arrays_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, as_stream(stream)>>>(
        static_cast<double*>(out), static_cast<const double*>(first), inputs, input_stride, n);
  } else if (dtype == DType::kFloat32) {
    sum_arrays_kernel<<<elementwise_grid(n), kElementwiseThreads, 0, as_stream(stream)>>>(
        static_cast<float*>(out), static_cast<const float*>(first), inputs, input_stride, n);
  } else {
    throw Error(ErrorCode::kInternal, "dtype", "sums take fp32 or fp64 arrays");
  }
  DPA_CUDA_CHECK_LAUNCH();
}

void order_after(void* waiting, void* stream) {
  if (waiting == stream) return;
  cudaEvent_t event = nullptr;
  DPA_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t recorded = cudaEventRecord(event, as_stream(stream));
  const cudaError_t waited =
      recorded == cudaSuccess ? cudaStreamWaitEvent(as_stream(waiting), event, 0) : recorded;
  cudaEventDestroy(event);  // released once the recorded work completes
  DPA_CUDA_CHECK(waited);
}

}  // namespace dpa::cuda
