// The two passes of the cuda_unfused backend (orchestration: workspaces, GEMMs, kernels).
#pragma once

#include "core/problem.h"

namespace dpa::cuda {

// DESIGN.md §3: S = Q K^T (cuBLAS), one softmax kernel per row (Pd, LSE), O = Pd V (cuBLAS).
void run_unfused_forward(const AttentionProblem& problem);

// DESIGN.md §4: S and dP = dO V^T (cuBLAS), one row kernel (Pd, dU, dbias terms, dalpha terms),
// dV = Pd^T dO, dQ = scale dU K, dK = scale dU^T Q (cuBLAS), deterministic reductions.
void run_unfused_backward(const AttentionProblem& problem);

}  // namespace dpa::cuda
