// DotProductAttention: API -> validate -> select -> backend (DESIGN.md §1).
#include "dpa/attention.h"

#include <string>

#include "api/workspace_call.h"
#include "core/backend.h"
#include "core/call_rng.h"
#include "core/environment.h"
#include "core/memory_overlap.h"
#include "core/problem_builder.h"
#include "core/selector.h"
#include "core/workspace.h"

namespace dpa {
BackwardArgs backward_args_for(const ForwardArgs& forward, const ForwardResult& result,
                               TensorView d_o, TensorView dq, TensorView dk, TensorView dv) {
  BackwardArgs args;
  args.in = forward.in;
  args.o = forward.o;
  args.lse = forward.lse;
  args.d_o = d_o;
  args.dq = dq;
  args.dk = dk;
  args.dv = dv;
  args.rng = result.rng;
  args.dropout = forward.dropout;
  args.stream = forward.stream;
  return args;
}

DotProductAttention::DotProductAttention(const AttentionConfig& config)
    : config_(config_with_environment(config, process_environment())) {
  validate_config(config_);
}

ForwardResult DotProductAttention::forward(const ForwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = call_rng_state(args.rng, config_.seed, next_offset_);
  AttentionProblem problem = build_forward_problem(config_, args, dropout, rng);
  require_forward_outputs_apart(args);
  const Backend& backend = choose_backend(config_, problem, registered_backends());
  run_in_workspace(
      args.workspace, [&] { return backend.workspace_bytes(problem); },
      [&] { backend.forward(problem); });
  if (call_advances_offset(args.rng, dropout)) ++next_offset_;
  return {backend.capabilities().kind, rng};
}

BackendKind DotProductAttention::backward(const BackwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  AttentionProblem problem = build_backward_problem(config_, args, dropout);
  require_backward_outputs_apart(args);
  const Backend& backend = choose_backend(config_, problem, registered_backends());
  run_in_workspace(
      args.workspace, [&] { return backend.workspace_bytes(problem); },
      [&] { backend.backward(problem); });
  return backend.capabilities().kind;
}

size_t DotProductAttention::workspace_size(const ForwardArgs& args) const {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = call_rng_state(args.rng, config_.seed, next_offset_);
  AttentionProblem problem = build_forward_problem(config_, args, dropout, rng);
  require_forward_outputs_apart(args);
  return choose_backend(config_, problem, registered_backends()).workspace_bytes(problem);
}

size_t DotProductAttention::workspace_size(const BackwardArgs& args) const {
  const double dropout = args.dropout.value_or(config_.dropout);
  AttentionProblem problem = build_backward_problem(config_, args, dropout);
  require_backward_outputs_apart(args);
  return choose_backend(config_, problem, registered_backends()).workspace_bytes(problem);
}

Selection DotProductAttention::explain(const AttentionInputs& in, Pass pass, bool wants_dbias,
                                       bool wants_dsoftmax_offset) const {
  AttentionProblem problem =
      build_explain_problem(config_, in, pass, wants_dbias, wants_dsoftmax_offset);
  return select_for_problem(config_, problem, registered_backends(), nullptr,
                            /*with_plans=*/true);
}

}  // namespace dpa
