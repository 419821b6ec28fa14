// The unfused backend's device workspace, planned by one function that both the selector's
// size limit and the run use, so "fits" can never disagree with what is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "core/backend.h"

namespace dpa::cuda {

struct UnfusedShape {
  Pass pass = Pass::kForward;
  DType dtype = DType::kFloat16;
  int64_t batch = 0, heads_q = 0, heads_kv = 0;
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  int64_t head_dim_qk = 0, head_dim_v = 0;
  bool dsoftmax_offset = false;
};

UnfusedShape unfused_shape(const FeatureRequest& request);
UnfusedShape unfused_shape(const AttentionProblem& problem);

// Bytes of each buffer; 0 when the pass does not use it. Saturates instead of overflowing.
struct UnfusedWorkspace {
  size_t scores = 0;      // fp32 [b, H, sq, skv] raw q.k
  size_t dprobs = 0;      // fp32 [b, H, sq, skv] dO . v, then the bias gradient (backward)
  size_t probs = 0;       // dtype [b, H, sq, skv] Pd
  size_t dlogits = 0;     // dtype [b, H, sq, skv] dU (backward)
  size_t rows_q = 0;      // fp32 [b, H, sq, d] o (forward, d = dv) or dq (backward, d = dqk)
  size_t rows_dk = 0;     // fp32 [b, G, skv, dqk] (backward)
  size_t rows_dv = 0;     // fp32 [b, G, skv, dv] (backward)
  size_t row_dalpha = 0;  // fp32 [b, H, sq] (backward with dsoftmax_offset)
  size_t pointers = 0;    // GEMM pointer arrays
  size_t cublas = 0;      // cuBLAS's own workspace

  size_t score_bytes() const;  // the O(b H sq skv) part
  size_t total() const;
};

UnfusedWorkspace plan_unfused_workspace(const UnfusedShape& shape);

// Every buffer a pass of this problem allocates, each aligned: the plan, the sequence tables
// and the packed copies of operands cuBLAS cannot read in place (the caller's workspace).
size_t unfused_call_workspace_bytes(const AttentionProblem& problem);

// Number of batch pointers per GEMM operand section (see unfused_operands.h).
int64_t unfused_pointer_count(const UnfusedShape& shape);

// Capabilities::size_limit: refuses when the workspace exceeds 80% of the device's free
// memory (the rest is headroom for the allocator's rounding and the caller's own tensors).
std::optional<std::string> unfused_size_limit(const FeatureRequest& request);

}  // namespace dpa::cuda
