// Entry points of the tiled CPU backend's two passes (the Backend class is in tiled_backend.cc).
#pragma once

#include "core/problem.h"

namespace dpa::cpu {

// Online-softmax forward: writes o and lse (DESIGN.md §3). Every row of o and lse is written,
// including padded rows and thd gap rows (o = 0, lse = the empty-row value).
void tiled_forward(const AttentionProblem& problem);

// FA2-style backward (P recomputed from the saved LSE): writes dq, dk, dv and, when requested,
// dbias and dsoftmax_offset (DESIGN.md §4). Every element of every output is written.
void tiled_backward(const AttentionProblem& problem);

}  // namespace dpa::cpu
