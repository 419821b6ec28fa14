// The backward row kernel of the unfused backend (DESIGN.md §4): one block per score row
// recomputes the softmax from the raw q.k (not from the saved LSE, so it needs no trust in the
// forward's backend), takes D_i = dO_i . o_i, and writes the operands of the gradient GEMMs:
// Pd (for dV = Pd^T dO) and dU (for dQ = scale dU K, dK = scale dU^T Q), both in the input
// dtype, plus the per-element bias gradient and the per-row sink gradient.
#include "cuda/cuda_check.h"
#include "cuda/unfused/unfused_row_math.cuh"

namespace dpa::cuda {
namespace unfused {
namespace {

template <typename T>
__global__ void softmax_backward_kernel(SoftmaxBackwardParams p) {
  __shared__ float shared[2 * kRowWarps];
  const int64_t rows = p.grid.batch * p.grid.heads * p.grid.max_seqlen_q;
  const int64_t row_length = p.grid.max_seqlen_kv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const RowContext r = make_row_context(p.grid, p.logits, row);
    float* dprobs = p.dprobs + row * row_length;  // [skv_max] in: dO . v_j; out: bias grad
    if (r.i >= r.seqlen_q) {
      // Padded query rows take no part in gradients; the dbias reduction reads them as 0.
      if (p.wants_dbias)
        for (int64_t j = threadIdx.x; j < row_length; j += blockDim.x) dprobs[j] = 0.f;
      if (p.row_dalpha && threadIdx.x == 0) p.row_dalpha[row] = 0.f;
      continue;
    }
    const float* scores = p.scores + row * row_length;           // [skv_max] raw q.k
    T* probs = static_cast<T*>(p.probs) + row * row_length;      // [skv_max] out Pd
    T* dlogits = static_cast<T*>(p.dlogits) + row * row_length;  // [skv_max] out dU

    // D_i = sum_c dO_ic * o_ic from the saved o (DESIGN.md §4).
    const int64_t packed_row = p.grid.start_q[r.b] + r.i;
    const T* o = static_cast<const T*>(p.o) + r.b * p.o_rows.batch + packed_row * p.o_rows.seq +
                 r.h * p.o_rows.head;  // [dv]
    const T* d_o = static_cast<const T*>(p.d_o) + r.b * p.do_rows.batch +
                   packed_row * p.do_rows.seq + r.h * p.do_rows.head;  // [dv]
    float partial = 0.f;
    for (int64_t c = threadIdx.x; c < p.head_dim_v; c += blockDim.x)
      partial += to_float(d_o[c]) * to_float(o[c]);
    const float d_row = block_sum(partial, shared);

    // Softmax statistics, exactly as in the forward kernel, or a CP tile's given final LSE
    // (m = LSE, z = 1: P = exp(s - LSE) over all keys and the sink, not just this tile's).
    MaxSum stats;
    if (p.given_lse) {
      stats.m = p.given_lse[p.lse_packed ? r.h * p.lse_total_q + p.grid.start_q[r.b] + r.i : row];
      stats.z = 1.f;
    } else {
      for (int64_t j = r.key_begin + threadIdx.x; j < r.key_end; j += blockDim.x) {
        float s, t;
        if (element_logit(p.logits, r, j, scores[j], s, t)) stats.add(s);
      }
      stats = block_max_sum(stats, shared);
      stats.merge(r.sink, 1.f);
    }
    const bool empty = stats.m == -INFINITY;
    const float inv_z = empty ? 0.f : 1.f / stats.z;

    for (int64_t j = threadIdx.x; j < row_length; j += blockDim.x) {
      if (j >= r.seqlen_kv) {  // outside the sequence: only the dbias reduction looks here
        if (p.wants_dbias) dprobs[j] = 0.f;
        continue;
      }
      float pd = 0.f, du = 0.f, grad = 0.f, s, t;
      if (!empty && element_logit(p.logits, r, j, scores[j], s, t)) {
        const float prob = expf(s - stats.m) * inv_z;
        const float keep = dropout_multiplier(p.logits, r, j);
        const float ds = prob * (dprobs[j] * keep - d_row);  // dS = P (dP - D)
        // dU = dS (1 - t^2), t = tanh(u / c): t comes from u before masking and tanh
        // saturates, so no -inf meets it.
        du = p.logits.softcap > 0.f ? ds * (1.f - t * t) : ds;
        pd = prob * keep;
        grad = p.dbias_pre_scale ? p.logits.scale * du : ds;
      }
      probs[j] = from_float<T>(pd);
      dlogits[j] = from_float<T>(du);
      if (p.wants_dbias) dprobs[j] = grad;  // same thread read dprobs[j] above
    }

    // dalpha_h = -sum_{b,i} exp(alpha_h - LSE_i) D_i; this row's term (0 for an empty row).
    if (p.row_dalpha && threadIdx.x == 0) {
      const float lse = stats.m + logf(stats.z);
      p.row_dalpha[row] = empty ? 0.f : -expf(r.sink - lse) * d_row;
    }
  }
}

}  // namespace
}  // namespace unfused

void launch_softmax_backward(const SoftmaxBackwardParams& params, DType dtype,
                             cudaStream_t stream) {
  const int64_t rows = params.grid.batch * params.grid.heads * params.grid.max_seqlen_q;
  if (rows == 0) return;
  const unsigned grid = unfused::row_grid(rows);
  switch (dtype) {
    case DType::kFloat16:
      unfused::softmax_backward_kernel<__half><<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    case DType::kBFloat16:
      unfused::softmax_backward_kernel<__nv_bfloat16>
          <<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    case DType::kFloat32:
      unfused::softmax_backward_kernel<float><<<grid, unfused::kRowThreads, 0, stream>>>(params);
      break;
    default:
      throw Error(ErrorCode::kInternal, "", "cuda_unfused: unsupported dtype for the softmax");
  }
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
