#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/fill_rows.h"

namespace dpa::cuda {
namespace {

// One thread per (batch, row, head, element); element_bytes 2 or 4.
__global__ void zero_rows_kernel(char* base, int element_bytes, int64_t batches, int64_t rows,
                                 int64_t heads, int64_t width, int64_t batch_stride,
                                 int64_t row_stride, int64_t head_stride) {
  const int64_t total = batches * rows * heads * width;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < total;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = n % width;
    const int64_t h = (n / width) % heads;
    const int64_t r = (n / (width * heads)) % rows;
    const int64_t b = n / (width * heads * rows);
    const int64_t offset = b * batch_stride + r * row_stride + h * head_stride + c;
    if (element_bytes == 2)
      reinterpret_cast<uint16_t*>(base)[offset] = 0;
    else
      reinterpret_cast<float*>(base)[offset] = 0.f;
  }
}

// lse: contiguous [batches, heads, rows].
__global__ void fill_lse_kernel(float* lse, int64_t batches, int64_t heads, int64_t rows,
                                int softmax_type, const float* softmax_offset) {
  const int64_t total = batches * heads * rows;
  for (int64_t n = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; n < total;
       n += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = (n / rows) % heads;
    lse[n] = sink_logit(softmax_type, softmax_offset, h);
  }
}

}  // namespace

bool has_rows_outside_sequences(const AttentionProblem& p, bool query_side) {
  const std::vector<int64_t>& lengths = query_side ? p.seqlen_q : p.seqlen_kv;
  if (p.format == Format::kTHD) {
    int64_t covered = 0;
    for (int64_t length : lengths) covered += length;
    return covered < (query_side ? p.total_q : p.total_kv);
  }
  const int64_t full = query_side ? p.max_seqlen_q : p.max_seqlen_kv;
  for (int64_t length : lengths)
    if (length < full) return true;
  return false;
}

void zero_stored_rows(const AttentionProblem& p, const TensorView& tensor, const RowLayout& layout,
                      bool query_side, int64_t heads, int64_t width, cudaStream_t stream) {
  const bool thd = p.format == Format::kTHD;
  const int64_t batches = thd ? 1 : p.batch;
  const int64_t rows =
      thd ? (query_side ? p.total_q : p.total_kv) : (query_side ? p.max_seqlen_q : p.max_seqlen_kv);
  const int64_t total = batches * rows * heads * width;
  if (total == 0) return;
  zero_rows_kernel<<<elementwise_grid(total), kElementwiseThreads, 0, stream>>>(
      static_cast<char*>(tensor.data), int(dtype_size(tensor.dtype)), batches, rows, heads, width,
      thd ? 0 : layout.stride_batch, layout.stride_seq, layout.stride_head);
  DPA_CUDA_CHECK_LAUNCH();
}

void fill_empty_forward_rows(const AttentionProblem& p, cudaStream_t stream) {
  zero_stored_rows(p, p.o, p.o_rows, true, p.heads_q, p.head_dim_v, stream);
  const bool thd = p.format == Format::kTHD;
  const int64_t batches = thd ? 1 : p.batch;
  const int64_t rows = thd ? p.total_q : p.max_seqlen_q;
  const int64_t total = batches * p.heads_q * rows;
  if (total == 0) return;
  // The empty-row LSE is the sink's logit, or -inf in a CP tile's partial (the sink joins once,
  // after the CP merge).
  const SoftmaxType softmax_type = p.cp.exclude_sink ? SoftmaxType::kVanilla : p.softmax_type;
  fill_lse_kernel<<<elementwise_grid(total), kElementwiseThreads, 0, stream>>>(
      static_cast<float*>(p.lse.data), batches, p.heads_q, rows, int(softmax_type),
      static_cast<const float*>(p.softmax_offset.data));
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
