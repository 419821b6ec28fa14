// Entry points of the tiled CPU backend: its forward and its backward (the Backend class is in
// tiled_backend.cc).
#pragma once

#include <cstdint>

#include "core/problem.h"

namespace dpa::cpu {

// Online-softmax forward: writes o and lse (DESIGN.md §3). Every row of o and lse is written,
// including padded rows and thd gap rows (o = 0, lse = the empty-row value).
void tiled_forward(const AttentionProblem& problem);

// FA2-style backward (P recomputed from the saved LSE): writes dq, dk, dv and, when requested,
// dbias and dsoftmax_offset (DESIGN.md §4). Every element of every output is written.
void tiled_backward(const AttentionProblem& problem);

// The forward's query heads per task (dividing the group's H/G): each key tile is gathered once
// for them all. The most that leave at least kForwardTasksPerThread tasks per thread of
// `threads`, else 1. Any choice gives the same bits.
constexpr int64_t kForwardTasksPerThread = 4;
int64_t forward_heads_per_task(const AttentionProblem& problem, int threads);

// The fused backward's dq accumulators (one per running task, [H/G, rows, head dim] fp32) may
// take at most this much memory together; past it the backward runs its two passes.
constexpr int64_t kFusedAccumulatorBytes = int64_t(512) << 20;

// Whether tiled_backward runs its fused plan (one task per batch and KV head, five products per
// pair of tiles) rather than its two passes (seven) with `threads` threads: see
// tiled_backward.cc. Both plans give the same bits for finite inputs.
bool fused_backward_applies(const AttentionProblem& problem, int threads);

}  // namespace dpa::cpu
