#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/cuda_check.h"
#include "cuda/device_common.cuh"
#include "cuda/flash/flash_tiles.h"
#include "cuda/flash/merge_partials.cuh"
#include "cuda/merge_row.cuh"

namespace dpa::cuda {
namespace {

static_assert(kFlashMaxSplits <= kMergeMaxSplits, "merge_row holds every split's weight");

// One block per query row (b, h, i), merge_row's threads over the head dim.
template <typename Element>
__global__ void __launch_bounds__(kMergeThreads)
    merge_partials_kernel(const FlashForwardParams p, int head_dim_v) {
  const int64_t row = blockIdx.x;
  const int i = int(row % p.max_seqlen_q);
  const int head = int((row / p.max_seqlen_q) % p.heads_q);
  const int batch = int(row / (int64_t(p.max_seqlen_q) * p.heads_q));
  if (i >= p.seqlen_q[batch]) return;  // the whole block: merge_row is not entered

  const int64_t split_stride = int64_t(p.batch) * p.heads_q * p.max_seqlen_q;  // rows per split
  // A CP tile's partial leaves the sink out: the CP merge adds it once.
  const float sink =
      p.exclude_sink ? -INFINITY : sink_logit(p.softmax_type, p.softmax_offset, head);
  const int64_t q_row = (p.start_q ? p.start_q[batch] : 0) + i;
  Element* o_row = static_cast<Element*>(p.o) + batch * p.o_batch_stride + q_row * p.o_row_stride +
                   head * p.o_head_stride;
  const float lse = merge_row(p.partial_lse, p.partial_o, split_stride, row, p.num_splits, sink,
                              head_dim_v, o_row);
  if (threadIdx.x == 0) p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride + q_row] = lse;
}

}  // namespace

void launch_merge_partials(const FlashForwardParams& p, DType dtype, int head_dim_v,
                           cudaStream_t stream) {
  const int64_t rows = int64_t(p.batch) * p.heads_q * p.max_seqlen_q;
  if (rows == 0) return;
  const dim3 grid{unsigned(rows)};
  if (dtype == DType::kBFloat16)
    merge_partials_kernel<__nv_bfloat16><<<grid, kMergeThreads, 0, stream>>>(p, head_dim_v);
  else
    merge_partials_kernel<__half><<<grid, kMergeThreads, 0, stream>>>(p, head_dim_v);
  DPA_CUDA_CHECK_LAUNCH();
}

}  // namespace dpa::cuda
