#include "cuda/unfused/unfused_workspace.h"

#include <cstdio>
#include <limits>

#include "core/workspace.h"
#include "cuda/runtime.h"
#include "cuda/sequence_tables.h"
#include "cuda/unfused/unfused_gemm.h"
#include "cuda/unfused/unfused_operands.h"

namespace dpa::cuda {
namespace {

constexpr size_t kMax = std::numeric_limits<size_t>::max();

size_t mul(size_t a, size_t b) { return (b != 0 && a > kMax / b) ? kMax : a * b; }
size_t mul(std::initializer_list<int64_t> factors) {
  size_t product = 1;
  for (int64_t f : factors) product = mul(product, size_t(f < 0 ? 0 : f));
  return product;
}
size_t add(size_t a, size_t b) { return a > kMax - b ? kMax : a + b; }

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f GiB", double(bytes) / double(size_t(1) << 30));
  return text;
}

// Share of free device memory the workspace may take.
constexpr double kFreeMemoryShare = 0.8;

}  // namespace

UnfusedShape unfused_shape(const FeatureRequest& r) {
  return {r.pass,         r.dtype,         r.batch,       r.heads_q,    r.heads_kv,
          r.max_seqlen_q, r.max_seqlen_kv, r.head_dim_qk, r.head_dim_v, r.sink_grad};
}

UnfusedShape unfused_shape(const AttentionProblem& p) {
  return {p.pass,         p.dtype,         p.batch,       p.heads_q,    p.heads_kv,
          p.max_seqlen_q, p.max_seqlen_kv, p.head_dim_qk, p.head_dim_v, p.wants_dsoftmax_offset};
}

size_t UnfusedWorkspace::score_bytes() const {
  return add(add(scores, dprobs), add(probs, dlogits));
}

size_t UnfusedWorkspace::total() const {
  size_t sum = score_bytes();
  for (size_t part : {rows_q, rows_dk, rows_dv, row_dalpha, pointers, cublas}) sum = add(sum, part);
  return sum;
}

int64_t unfused_pointer_count(const UnfusedShape& s) {
  const int64_t per_head = s.batch * s.heads_q;
  // Forward: q, k, v, scores, probs, o. Backward: q, k, v, d_o, scores, dprobs, dlogits, dq
  // over [b, H], and six dk/dv sections over [H/G][b][G] (also b * H entries each).
  return s.pass == Pass::kForward ? 6 * per_head : 14 * per_head;
}

UnfusedWorkspace plan_unfused_workspace(const UnfusedShape& s) {
  UnfusedWorkspace w;
  const size_t element = dtype_size(s.dtype);
  const size_t grid = mul({s.batch, s.heads_q, s.max_seqlen_q, s.max_seqlen_kv});
  w.scores = mul(grid, sizeof(float));
  w.probs = mul(grid, element);
  w.pointers = mul(size_t(unfused_pointer_count(s)), sizeof(void*));
  w.cublas = CublasSession::kWorkspaceBytes;
  if (s.pass == Pass::kForward) {
    w.rows_q = mul({s.batch, s.heads_q, s.max_seqlen_q, s.head_dim_v, int64_t(sizeof(float))});
    return w;
  }
  w.dprobs = mul(grid, sizeof(float));
  w.dlogits = mul(grid, element);
  w.rows_q = mul({s.batch, s.heads_q, s.max_seqlen_q, s.head_dim_qk, int64_t(sizeof(float))});
  w.rows_dk = mul({s.batch, s.heads_kv, s.max_seqlen_kv, s.head_dim_qk, int64_t(sizeof(float))});
  w.rows_dv = mul({s.batch, s.heads_kv, s.max_seqlen_kv, s.head_dim_v, int64_t(sizeof(float))});
  if (s.dsoftmax_offset)
    w.row_dalpha = mul({s.batch, s.heads_q, s.max_seqlen_q, int64_t(sizeof(float))});
  return w;
}

size_t unfused_call_workspace_bytes(const AttentionProblem& p) {
  const UnfusedWorkspace w = plan_unfused_workspace(unfused_shape(p));
  const bool backward = p.pass == Pass::kBackward;
  const size_t q = GemmSource::staging_bytes(p, p.q, p.q_rows, true, p.heads_q, p.head_dim_qk);
  const size_t k = GemmSource::staging_bytes(p, p.k, p.k_rows, false, p.heads_kv, p.head_dim_qk);
  const size_t v = GemmSource::staging_bytes(p, p.v, p.v_rows, false, p.heads_kv, p.head_dim_v);
  const size_t d_o =
      backward ? GemmSource::staging_bytes(p, p.d_o, p.do_rows, true, p.heads_q, p.head_dim_v) : 0;
  return workspace_bytes_for({sequence_tables_bytes(p), w.scores, w.dprobs, w.probs, w.dlogits,
                              w.rows_q, w.rows_dk, w.rows_dv, w.row_dalpha, w.pointers, w.cublas, q,
                              k, v, d_o});
}

std::optional<std::string> unfused_size_limit(const FeatureRequest& request) {
  const UnfusedWorkspace workspace = plan_unfused_workspace(unfused_shape(request));
  const size_t free_bytes = free_device_memory(request.device_index);
  if (free_bytes == 0) return std::nullopt;  // unknown: let the allocation decide
  if (double(workspace.total()) <= kFreeMemoryShare * double(free_bytes)) return std::nullopt;
  return "needs " + gib(workspace.total()) + " of workspace (" + gib(workspace.score_bytes()) +
         " for the O(b*H*sq*skv) scores), " + gib(free_bytes) + " free on device " +
         std::to_string(request.device_index);
}

}  // namespace dpa::cuda
