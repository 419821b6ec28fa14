// The forward softmax of the unfused backend: one block per score row turns the raw q.k of the
// first GEMM into Pd = P * keep / keep_prob (input dtype, the A operand of O = Pd V) and LSE.
#include "cuda/cuda_check.h"
#include "cuda/unfused/unfused_row_math.cuh"

namespace dpa::cuda {
namespace unfused {
namespace {

template <typename T>
__global__ void softmax_forward_kernel(SoftmaxForwardParams p) {
  __shared__ float shared[2 * kRowWarps];
  const int64_t rows = p.grid.batch * p.grid.heads * p.grid.max_seqlen_q;
  const int64_t row_length = p.grid.max_seqlen_kv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const RowContext r = make_row_context(p.grid, p.logits, row);
    // Rows past the sequence end are neither read by the second GEMM (it runs on the
    // sequence's own rows) nor stored; their LSE was filled with the empty-row value.
    if (r.i >= r.seqlen_q) continue;
    const float* scores = p.scores + row * row_length;       // [skv_max] raw q.k of row i
    T* probs = static_cast<T*>(p.probs) + row * row_length;  // [skv_max] Pd of row i

    // Pass 1: max and sum over the visible keys, then the sink (DESIGN.md §3.6).
    MaxSum stats;
    for (int64_t j = r.key_begin + threadIdx.x; j < r.key_end; j += blockDim.x) {
      float s, t;
      if (element_logit(p.logits, r, j, scores[j], s, t)) stats.add(s);
    }
    stats = block_max_sum(stats, shared);
    stats.merge(r.sink, 1.f);  // exp(sigma - m); sigma = -inf (no sink) adds nothing
    // m = -inf: no visible key and no sink; P = 0 and LSE = -inf (never NaN).
    const bool empty = stats.m == -INFINITY;
    const float inv_z = empty ? 0.f : 1.f / stats.z;
    if (threadIdx.x == 0) {
      const int64_t lse_index =
          p.lse_packed ? r.h * p.lse_total_q + p.grid.start_q[r.b] + r.i : row;
      p.lse[lse_index] = empty ? -INFINITY : stats.m + logf(stats.z);
    }

    // Pass 2: every key of the sequence gets its Pd (0 when masked), so the GEMM over
    // [0, skv_b) needs no mask.
    for (int64_t j = threadIdx.x; j < r.seqlen_kv; j += blockDim.x) {
      float prob = 0.f, s, t;
      if (!empty && element_logit(p.logits, r, j, scores[j], s, t))
        prob = expf(s - stats.m) * inv_z * dropout_multiplier(p.logits, r, j);
      probs[j] = from_float<T>(prob);
    }
  }
}

}  // namespace
}  // namespace unfused

void launch_softmax_forward(const SoftmaxForwardParams& params, DType dtype, cudaStream_t stream) {
  const int64_t rows = params.grid.batch * params.grid.heads * params.grid.max_seqlen_q;
  if (rows == 0) return;
  const unsigned grid = unfused::row_grid(rows);
  switch (dtype) {
    case DType::kFloat16:
      unfused::softmax_forward_kernel<__half><<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    case DType::kBFloat16:
      unfused::softmax_forward_kernel<__nv_bfloat16>
          <<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    case DType::kFloat32:
      unfused::softmax_forward_kernel<float><<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    default:
      throw Error(ErrorCode::kInternal, "", "cuda_unfused: unsupported dtype for the softmax");
  }
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
