#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "cuda/fill_rows.h"
#include "cuda/sequence_tables.h"
#include "cuda/unfused/unfused_gemm.h"
#include "cuda/unfused/unfused_kernels.h"
#include "cuda/unfused/unfused_operands.h"
#include "cuda/unfused/unfused_passes.h"
#include "cuda/unfused/unfused_workspace.h"

namespace dpa::cuda {

void run_unfused_forward(const AttentionProblem& p) {
  DeviceGuard device(p.device_index);  // first: outlives every buffer below
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int64_t batch = p.batch, heads = p.heads_q, seqlen_q = p.max_seqlen_q,
                seqlen_kv = p.max_seqlen_kv, dim_qk = p.head_dim_qk, dim_v = p.head_dim_v;
  const size_t element = dtype_size(p.dtype);
  const UnfusedWorkspace plan = plan_unfused_workspace(unfused_shape(p));

  // Rows outside every sequence get o = 0 and the empty-row LSE; the kernels below overwrite
  // every row inside a sequence.
  if (has_rows_outside_sequences(p, true)) fill_empty_forward_rows(p, stream);
  const SequenceTables tables = upload_sequence_tables(p, stream);

  DeviceBuffer scores(plan.scores, stream);  // [b, H, sq, skv] fp32 raw q.k
  DeviceBuffer probs(plan.probs, stream);    // [b, H, sq, skv] dtype Pd
  DeviceBuffer o_rows(plan.rows_q, stream);  // [b, H, sq, dv] fp32 O before the dtype cast
  // Sequences without keys run no second GEMM; their rows must read as o = 0.
  if (plan.rows_q) DPA_CUDA_CHECK(cudaMemsetAsync(o_rows.get(), 0, plan.rows_q, stream));

  const GemmSource q(p, p.q, p.q_rows, true, heads, dim_qk, stream);
  const GemmSource k(p, p.k, p.k_rows, false, p.heads_kv, dim_qk, stream);
  const GemmSource v(p, p.v, p.v_rows, false, p.heads_kv, dim_v, stream);

  // Batch pointers in [b, H] order; query head h reads KV head h / (H / G) (GQA, no copies).
  auto per_head = [&](auto&& pointer_of) {
    std::vector<const void*> pointers;
    pointers.reserve(size_t(batch * heads));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) pointers.push_back(pointer_of(b, h, b * heads + h));
    return pointers;
  };
  PointerTable table;
  const size_t q_ptrs =
      table.add(per_head([&](int64_t b, int64_t h, int64_t) { return q.matrix(b, h); }));
  const size_t k_ptrs =
      table.add(per_head([&](int64_t b, int64_t h, int64_t) { return k.matrix(b, p.kv_head(h)); }));
  const size_t v_ptrs =
      table.add(per_head([&](int64_t b, int64_t h, int64_t) { return v.matrix(b, p.kv_head(h)); }));
  const size_t s_ptrs = table.add(per_head([&](int64_t, int64_t, int64_t n) -> const void* {
    return scores.get<float>() + n * seqlen_q * seqlen_kv;
  }));
  const size_t p_ptrs = table.add(per_head([&](int64_t, int64_t, int64_t n) -> const void* {
    return probs.get<char>() + size_t(n * seqlen_q * seqlen_kv) * element;
  }));
  const size_t o_ptrs = table.add(per_head([&](int64_t, int64_t, int64_t n) -> const void* {
    return o_rows.get<float>() + n * seqlen_q * dim_v;
  }));
  table.upload(stream);

  const CublasSession cublas(p.device_index, stream);
  const std::vector<SequenceGroup> groups = sequence_groups(p);
  // S [sq_b, skv_b] = Q [sq_b, dqk] K^T, in the top-left corner of each [sq, skv] block.
  for (const SequenceGroup& g : groups) {
    const int64_t first = g.first_batch * heads, count = g.batches * heads;
    batched_gemm_row_major(cublas, false, true, g.seqlen_q, g.seqlen_kv, dim_qk, 1.f,
                           table.at(q_ptrs, first), q.ld(), table.at(k_ptrs, first), k.ld(), 0.f,
                           table.writable_at(s_ptrs, first), seqlen_kv, count, p.dtype);
  }

  SoftmaxForwardParams softmax;
  softmax.grid = score_grid(p, tables.seqlen_q, tables.seqlen_kv, tables.start_q);
  softmax.logits = logit_transform(p, tables);
  softmax.scores = scores.get<float>();
  softmax.probs = probs.get();
  softmax.lse = static_cast<float*>(p.lse.data);
  softmax.lse_packed = p.format == Format::kTHD;
  softmax.lse_total_q = p.total_q;
  launch_softmax_forward(softmax, p.dtype, stream);

  // O [sq_b, dv] = Pd [sq_b, skv_b] V [skv_b, dv].
  for (const SequenceGroup& g : groups) {
    const int64_t first = g.first_batch * heads, count = g.batches * heads;
    batched_gemm_row_major(cublas, false, false, g.seqlen_q, dim_v, g.seqlen_kv, 1.f,
                           table.at(p_ptrs, first), seqlen_kv, table.at(v_ptrs, first), v.ld(), 0.f,
                           table.writable_at(o_ptrs, first), dim_v, count, p.dtype);
  }
  launch_store_rows(o_rows.get<float>(), batch, heads, seqlen_q, dim_v, tables.seqlen_q,
                    tables.start_q, p.o.data, row_strides(p.o_rows), p.dtype, stream);
}

}  // namespace dpa::cuda
