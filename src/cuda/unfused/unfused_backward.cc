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
namespace {

void zero_async(const DeviceBuffer& buffer, cudaStream_t stream) {
  if (buffer.bytes() > 0) DPA_CUDA_CHECK(cudaMemsetAsync(buffer.get(), 0, buffer.bytes(), stream));
}

}  // namespace

void run_unfused_backward(const AttentionProblem& p) {
  DeviceGuard device(p.device_index);  // first: outlives every buffer below
  const auto stream = static_cast<cudaStream_t>(p.stream);
  const int64_t batch = p.batch, heads = p.heads_q, heads_kv = p.heads_kv, group = p.group_size(),
                seqlen_q = p.max_seqlen_q, seqlen_kv = p.max_seqlen_kv, dim_qk = p.head_dim_qk,
                dim_v = p.head_dim_v;
  const size_t element = dtype_size(p.dtype);
  const UnfusedWorkspace plan = plan_unfused_workspace(unfused_shape(p));
  const SequenceTables tables = upload_sequence_tables(p, stream);

  DeviceBuffer scores(plan.scores, stream);          // [b, H, sq, skv] fp32 raw q.k
  DeviceBuffer dprobs(plan.dprobs, stream);          // [b, H, sq, skv] fp32 dO.v, then dbias terms
  DeviceBuffer probs(plan.probs, stream);            // [b, H, sq, skv] dtype Pd
  DeviceBuffer dlogits(plan.dlogits, stream);        // [b, H, sq, skv] dtype dU
  DeviceBuffer dq_rows(plan.rows_q, stream);         // [b, H, sq, dqk] fp32
  DeviceBuffer dk_rows(plan.rows_dk, stream);        // [b, G, skv, dqk] fp32, summed over the group
  DeviceBuffer dv_rows(plan.rows_dv, stream);        // [b, G, skv, dv] fp32, summed over the group
  DeviceBuffer row_dalpha(plan.row_dalpha, stream);  // [b, H, sq] fp32
  // Skipped sequences (no query or no key) must read as zero gradients; dk/dv accumulate with
  // beta = 1 from zero, one group member after the other (a fixed order: deterministic).
  zero_async(dq_rows, stream);
  zero_async(dk_rows, stream);
  zero_async(dv_rows, stream);

  const GemmSource q(p, p.q, p.q_rows, true, heads, dim_qk, stream);
  const GemmSource k(p, p.k, p.k_rows, false, heads_kv, dim_qk, stream);
  const GemmSource v(p, p.v, p.v_rows, false, heads_kv, dim_v, stream);
  const GemmSource d_o(p, p.d_o, p.do_rows, true, heads, dim_v, stream);

  auto grid_pointer = [&](const DeviceBuffer& buffer, size_t bytes, int64_t n) -> const void* {
    return buffer.get<char>() + size_t(n * seqlen_q * seqlen_kv) * bytes;
  };
  // Sections in [b, H] order (query head h reads KV head h / (H / G)).
  auto per_head = [&](auto&& pointer_of) {
    std::vector<const void*> pointers;
    pointers.reserve(size_t(batch * heads));
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t h = 0; h < heads; ++h) pointers.push_back(pointer_of(b, h));
    return pointers;
  };
  // Sections in [H/G][b][G] order: the GEMM for group member r runs over (b, g) with query
  // head h = g * (H/G) + r, accumulating into KV head g's rows.
  auto per_member = [&](auto&& pointer_of) {
    std::vector<const void*> pointers;
    pointers.reserve(size_t(batch * heads));
    for (int64_t r = 0; r < group; ++r)
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t g = 0; g < heads_kv; ++g) pointers.push_back(pointer_of(b, g * group + r, g));
    return pointers;
  };
  PointerTable table;
  const size_t q_ptrs = table.add(per_head([&](int64_t b, int64_t h) { return q.matrix(b, h); }));
  const size_t k_ptrs =
      table.add(per_head([&](int64_t b, int64_t h) { return k.matrix(b, p.kv_head(h)); }));
  const size_t v_ptrs =
      table.add(per_head([&](int64_t b, int64_t h) { return v.matrix(b, p.kv_head(h)); }));
  const size_t do_ptrs =
      table.add(per_head([&](int64_t b, int64_t h) { return d_o.matrix(b, h); }));
  const size_t s_ptrs = table.add(per_head(
      [&](int64_t b, int64_t h) { return grid_pointer(scores, sizeof(float), b * heads + h); }));
  const size_t dp_ptrs = table.add(per_head(
      [&](int64_t b, int64_t h) { return grid_pointer(dprobs, sizeof(float), b * heads + h); }));
  const size_t du_ptrs = table.add(per_head(
      [&](int64_t b, int64_t h) { return grid_pointer(dlogits, element, b * heads + h); }));
  const size_t dq_ptrs = table.add(per_head([&](int64_t b, int64_t h) -> const void* {
    return dq_rows.get<float>() + (b * heads + h) * seqlen_q * dim_qk;
  }));
  const size_t member_probs = table.add(per_member(
      [&](int64_t b, int64_t h, int64_t) { return grid_pointer(probs, element, b * heads + h); }));
  const size_t member_dlogits = table.add(per_member([&](int64_t b, int64_t h, int64_t) {
    return grid_pointer(dlogits, element, b * heads + h);
  }));
  const size_t member_q =
      table.add(per_member([&](int64_t b, int64_t h, int64_t) { return q.matrix(b, h); }));
  const size_t member_do =
      table.add(per_member([&](int64_t b, int64_t h, int64_t) { return d_o.matrix(b, h); }));
  const size_t member_dk = table.add(per_member([&](int64_t b, int64_t, int64_t g) -> const void* {
    return dk_rows.get<float>() + (b * heads_kv + g) * seqlen_kv * dim_qk;
  }));
  const size_t member_dv = table.add(per_member([&](int64_t b, int64_t, int64_t g) -> const void* {
    return dv_rows.get<float>() + (b * heads_kv + g) * seqlen_kv * dim_v;
  }));
  table.upload(stream);

  const CublasSession cublas(p.device_index, stream);
  const std::vector<SequenceGroup> groups = sequence_groups(p);
  // S = Q K^T and dP = dO V^T, [sq_b, skv_b] in the top-left corner of each block.
  for (const SequenceGroup& g : groups) {
    const int64_t first = g.first_batch * heads, count = g.batches * heads;
    batched_gemm_row_major(cublas, false, true, g.seqlen_q, g.seqlen_kv, dim_qk, 1.f,
                           table.at(q_ptrs, first), q.ld(), table.at(k_ptrs, first), k.ld(), 0.f,
                           table.writable_at(s_ptrs, first), seqlen_kv, count, p.dtype);
    batched_gemm_row_major(cublas, false, true, g.seqlen_q, g.seqlen_kv, dim_v, 1.f,
                           table.at(do_ptrs, first), d_o.ld(), table.at(v_ptrs, first), v.ld(), 0.f,
                           table.writable_at(dp_ptrs, first), seqlen_kv, count, p.dtype);
  }

  SoftmaxBackwardParams rows;
  rows.grid = score_grid(p, tables.seqlen_q, tables.seqlen_kv, tables.start_q);
  rows.logits = logit_transform(p, tables);
  rows.scores = scores.get<float>();
  rows.dprobs = dprobs.get<float>();
  rows.probs = probs.get();
  rows.dlogits = dlogits.get();
  rows.o = p.o.data;
  rows.d_o = p.d_o.data;
  rows.o_rows = row_strides(p.o_rows);
  rows.do_rows = row_strides(p.do_rows);
  rows.head_dim_v = dim_v;
  rows.wants_dbias = p.wants_dbias;
  rows.dbias_pre_scale = p.bias_type == BiasType::kPreScale;
  rows.row_dalpha = p.wants_dsoftmax_offset ? row_dalpha.get<float>() : nullptr;
  if (p.cp.use_given_lse) {
    rows.given_lse = static_cast<const float*>(p.lse.data);
    rows.lse_packed = p.format == Format::kTHD;
    rows.lse_total_q = p.total_q;
  }
  launch_softmax_backward(rows, p.dtype, stream);

  const float scale = float(p.scale);
  for (const SequenceGroup& g : groups) {
    const int64_t first = g.first_batch * heads, count = g.batches * heads;
    // dQ [sq_b, dqk] = scale * dU [sq_b, skv_b] K [skv_b, dqk].
    batched_gemm_row_major(cublas, false, false, g.seqlen_q, dim_qk, g.seqlen_kv, scale,
                           table.at(du_ptrs, first), seqlen_kv, table.at(k_ptrs, first), k.ld(),
                           0.f, table.writable_at(dq_ptrs, first), dim_qk, count, p.dtype);
    for (int64_t r = 0; r < group; ++r) {
      const int64_t member_first = (r * batch + g.first_batch) * heads_kv;
      const int64_t member_count = g.batches * heads_kv;
      // dV_g [skv_b, dv] += Pd_h^T [skv_b, sq_b] dO_h [sq_b, dv] for h = g * (H/G) + r.
      batched_gemm_row_major(
          cublas, true, false, g.seqlen_kv, dim_v, g.seqlen_q, 1.f,
          table.at(member_probs, member_first), seqlen_kv, table.at(member_do, member_first),
          d_o.ld(), 1.f, table.writable_at(member_dv, member_first), dim_v, member_count, p.dtype);
      // dK_g [skv_b, dqk] += scale * dU_h^T [skv_b, sq_b] Q_h [sq_b, dqk].
      batched_gemm_row_major(
          cublas, true, false, g.seqlen_kv, dim_qk, g.seqlen_q, scale,
          table.at(member_dlogits, member_first), seqlen_kv, table.at(member_q, member_first),
          q.ld(), 1.f, table.writable_at(member_dk, member_first), dim_qk, member_count, p.dtype);
    }
  }

  // Rows outside every sequence get zero gradients; the stores overwrite the rest.
  if (has_rows_outside_sequences(p, true))
    zero_stored_rows(p, p.dq, p.dq_rows, true, heads, dim_qk, stream);
  if (has_rows_outside_sequences(p, false)) {
    zero_stored_rows(p, p.dk, p.dk_rows, false, heads_kv, dim_qk, stream);
    zero_stored_rows(p, p.dv, p.dv_rows, false, heads_kv, dim_v, stream);
  }
  launch_store_rows(dq_rows.get<float>(), batch, heads, seqlen_q, dim_qk, tables.seqlen_q,
                    tables.start_q, p.dq.data, row_strides(p.dq_rows), p.dtype, stream);
  launch_store_rows(dk_rows.get<float>(), batch, heads_kv, seqlen_kv, dim_qk, tables.seqlen_kv,
                    tables.start_kv, p.dk.data, row_strides(p.dk_rows), p.dtype, stream);
  launch_store_rows(dv_rows.get<float>(), batch, heads_kv, seqlen_kv, dim_v, tables.seqlen_kv,
                    tables.start_kv, p.dv.data, row_strides(p.dv_rows), p.dtype, stream);

  if (p.wants_dbias)
    launch_reduce_dbias(dprobs.get<float>(), batch, heads, seqlen_q, seqlen_kv, p.dbias.shape[0],
                        p.dbias.shape[1], p.dbias.shape[2], p.dbias.data, p.dbias.dtype, stream);
  if (p.wants_dsoftmax_offset)
    launch_reduce_dalpha(row_dalpha.get<float>(), batch, heads, seqlen_q,
                         static_cast<float*>(p.dsoftmax_offset.data), stream);
}

}  // namespace dpa::cuda
