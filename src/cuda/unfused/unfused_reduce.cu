// Deterministic reductions of the unfused backward: the bias gradient over the bias's
// broadcast dims and the sink gradient over batch and rows. Each output is summed by one
// thread (dbias) or one block (dalpha) in a fixed order, in fp64: no atomics, so results are
// bit-identical run to run, and fp64 keeps long sums close to the fp64 oracle.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/unfused/unfused_kernels.h"

namespace dpa::cuda {
namespace unfused {
namespace {

constexpr int kDbiasThreads = 256;
constexpr int kDalphaThreads = 512;

__device__ __forceinline__ void store_any_float(void* base, DType dtype, int64_t offset,
                                                double value) {
  switch (dtype) {
    case DType::kFloat16:
      static_cast<__half*>(base)[offset] = __float2half_rn(float(value));
      break;
    case DType::kBFloat16:
      static_cast<__nv_bfloat16*>(base)[offset] = __float2bfloat16_rn(float(value));
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[offset] = value;
      break;
    default:
      static_cast<float*>(base)[offset] = float(value);
      break;
  }
}

// gradients: [b, H, sq_max, skv_max]; dbias: contiguous [bias_batch, bias_heads, bias_rows,
// skv_max] where each of the first three is either full or 1 (broadcast: summed over).
__global__ void reduce_dbias_kernel(const float* gradients, int64_t batch, int64_t heads,
                                    int64_t max_seqlen_q, int64_t max_seqlen_kv, int64_t bias_batch,
                                    int64_t bias_heads, int64_t bias_rows, void* dbias,
                                    DType dbias_dtype) {
  const int64_t total = bias_batch * bias_heads * bias_rows * max_seqlen_kv;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < total;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = n % max_seqlen_kv;
    const int64_t bias_i = (n / max_seqlen_kv) % bias_rows;
    const int64_t bias_h = (n / (max_seqlen_kv * bias_rows)) % bias_heads;
    const int64_t bias_b = n / (max_seqlen_kv * bias_rows * bias_heads);
    // A dim of extent 1 against a larger full extent is broadcast: sum all of it.
    const bool sum_b = bias_batch != batch, sum_h = bias_heads != heads,
               sum_i = bias_rows != max_seqlen_q;
    const int64_t b_begin = sum_b ? 0 : bias_b, b_end = sum_b ? batch : bias_b + 1;
    const int64_t h_begin = sum_h ? 0 : bias_h, h_end = sum_h ? heads : bias_h + 1;
    const int64_t i_begin = sum_i ? 0 : bias_i, i_end = sum_i ? max_seqlen_q : bias_i + 1;
    double sum = 0.0;
    for (int64_t b = b_begin; b < b_end; ++b)
      for (int64_t h = h_begin; h < h_end; ++h)
        for (int64_t i = i_begin; i < i_end; ++i)
          sum += gradients[((b * heads + h) * max_seqlen_q + i) * max_seqlen_kv + j];
    store_any_float(dbias, dbias_dtype, n, sum);
  }
}

// row_dalpha: [b, H, sq_max]; one block per head h sums its b * sq_max terms in a fixed order
// (deterministic). Each thread walks a sequence's rows with a stride of the block and keeps
// four loads in flight, with no 64-bit division per element: with one block per head (64 for
// gpt-oss) the kernel is latency-bound, and the old loop (a division and a dependent load per
// term) took 35 us of a 1 ms backward.
__global__ void __launch_bounds__(kDalphaThreads)
    reduce_dalpha_kernel(const float* row_dalpha, int64_t batch, int64_t heads,
                         int64_t max_seqlen_q, float* dalpha) {
  __shared__ double partials[kDalphaThreads];
  const int64_t h = blockIdx.x;
  double sum = 0.0;
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = row_dalpha + (b * heads + h) * max_seqlen_q;
    int64_t i = threadIdx.x;
    for (; i + 3 * kDalphaThreads < max_seqlen_q; i += 4 * kDalphaThreads) {
      const float t0 = row[i], t1 = row[i + kDalphaThreads];
      const float t2 = row[i + 2 * kDalphaThreads], t3 = row[i + 3 * kDalphaThreads];
      sum += (double(t0) + double(t1)) + (double(t2) + double(t3));
    }
    for (; i < max_seqlen_q; i += kDalphaThreads) sum += row[i];
  }
  partials[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = kDalphaThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partials[threadIdx.x] += partials[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) dalpha[h] = float(partials[0]);
}

}  // namespace
}  // namespace unfused

void launch_reduce_dbias(const float* gradients, int64_t batch, int64_t heads, int64_t max_seqlen_q,
                         int64_t max_seqlen_kv, int64_t bias_batch, int64_t bias_heads,
                         int64_t bias_rows, void* dbias, DType dbias_dtype, cudaStream_t stream) {
  const int64_t total = bias_batch * bias_heads * bias_rows * max_seqlen_kv;
  if (total == 0) return;
  const int64_t blocks = (total + unfused::kDbiasThreads - 1) / unfused::kDbiasThreads;
  unfused::reduce_dbias_kernel<<<unsigned(blocks < 65536 ? blocks : 65536), unfused::kDbiasThreads,
                                 0, stream>>>(gradients, batch, heads, max_seqlen_q, max_seqlen_kv,
                                              bias_batch, bias_heads, bias_rows, dbias,
                                              dbias_dtype);
  DPA_CUDA_CHECK_LAUNCH();
}

void launch_reduce_dalpha(const float* row_dalpha, int64_t batch, int64_t heads,
                          int64_t max_seqlen_q, float* dalpha, cudaStream_t stream) {
  if (heads == 0) return;
  unfused::reduce_dalpha_kernel<<<unsigned(heads), unfused::kDalphaThreads, 0, stream>>>(
      row_dalpha, batch, heads, max_seqlen_q, dalpha);
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
