// Validation (DESIGN.md §7) and resolution of a call into an AttentionProblem.
// Everything is checked here, before any backend runs; a failure throws dpa::Error naming the
// argument and nothing has been written.
#pragma once

#include "core/problem.h"
#include "dpa/arguments.h"
#include "dpa/error.h"
#include "dpa/selection.h"

namespace dpa {

// Checks the config on its own (softcap, dropout, scale, window against mask, ...).
void validate_config(const AttentionConfig& config);

// Forward call: `rng` is the state that dropout will use; `dropout` the effective probability.
AttentionProblem build_forward_problem(const AttentionConfig& config, const ForwardArgs& args,
                                       double dropout, const RngState& rng);

AttentionProblem build_backward_problem(const AttentionConfig& config, const BackwardArgs& args,
                                        double dropout);

// Shapes only: tensor contents (cu_seqlens) are not read and data pointers may be null.
AttentionProblem build_explain_problem(const AttentionConfig& config, const AttentionInputs& in,
                                       Pass pass, bool wants_dbias, bool wants_dsoftmax_offset);

}  // namespace dpa
