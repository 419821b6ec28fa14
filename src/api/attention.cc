// DotProductAttention: API -> validate -> select -> backend (DESIGN.md §1).
#include "dpa/attention.h"

#include <string>

#include "core/backend.h"
#include "core/logging.h"
#include "core/problem_builder.h"
#include "core/selector.h"
#include "core/workspace.h"

namespace dpa {
namespace {

Selection select_for(const AttentionConfig& config, const AttentionProblem& problem,
                     FeatureRequest* request_out = nullptr) {
  FeatureRequest request = make_feature_request(problem);
  std::vector<const Capabilities*> candidates;
  for (const Backend* backend : registered_backends())
    candidates.push_back(&backend->capabilities());
  Selection selection = select_backend(request, candidates, forced_backend(config.backend));
  if (request_out) *request_out = request;
  return selection;
}

const Backend& run_selection(const AttentionConfig& config, const AttentionProblem& problem) {
  FeatureRequest request;
  Selection selection = select_for(config, problem, &request);
  log_selection(request, selection);
  require_chosen(selection);
  for (const Backend* backend : registered_backends())
    if (backend->capabilities().kind == *selection.chosen) return *backend;
  throw Error(ErrorCode::kInternal, "", "selected backend is not registered");
}

// Runs `pass` with the caller's workspace as the thread's arena, when one is given.
template <typename Run>
void run_in_workspace(const Backend& backend, const AttentionProblem& problem,
                      const Workspace& workspace, Run&& pass) {
  if (!workspace.given()) return pass();
  const size_t needed = backend.workspace_bytes(problem);
  void* data = workspace.data;
  size_t bytes = workspace.bytes;
  if (workspace.allocate) {
    if (needed == 0) return pass();
    data = workspace.allocate(needed);
    bytes = needed;
    require(data != nullptr, "workspace", "the allocator returned no memory");
  } else {
    require(bytes >= needed, "workspace",
            "has " + std::to_string(bytes) + " bytes, the call needs " + std::to_string(needed) +
                " (workspace_size)");
  }
  require(reinterpret_cast<uintptr_t>(data) % kWorkspaceAlignment == 0, "workspace",
          "must start on a " + std::to_string(kWorkspaceAlignment) +
              "-byte boundary (as cudaMalloc's blocks do)");
  WorkspaceArena arena(data, bytes);
  WorkspaceScope scope(&arena);
  pass();
}

}  // namespace

DotProductAttention::DotProductAttention(const AttentionConfig& config) : config_(config) {
  validate_config(config_);
}

ForwardResult DotProductAttention::forward(const ForwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = args.rng.value_or(RngState{config_.seed, next_offset_});
  AttentionProblem problem = build_forward_problem(config_, args, dropout, rng);
  const Backend& backend = run_selection(config_, problem);
  run_in_workspace(backend, problem, args.workspace, [&] { backend.forward(problem); });
  // Each call that draws dropout from the object's own state gets a fresh offset.
  if (!args.rng && problem.dropout_threshold > 0) ++next_offset_;
  return {backend.capabilities().kind, rng};
}

BackendKind DotProductAttention::backward(const BackwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  AttentionProblem problem = build_backward_problem(config_, args, dropout);
  const Backend& backend = run_selection(config_, problem);
  run_in_workspace(backend, problem, args.workspace, [&] { backend.backward(problem); });
  return backend.capabilities().kind;
}

size_t DotProductAttention::workspace_size(const ForwardArgs& args) const {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = args.rng.value_or(RngState{config_.seed, next_offset_});
  AttentionProblem problem = build_forward_problem(config_, args, dropout, rng);
  return run_selection(config_, problem).workspace_bytes(problem);
}

size_t DotProductAttention::workspace_size(const BackwardArgs& args) const {
  const double dropout = args.dropout.value_or(config_.dropout);
  AttentionProblem problem = build_backward_problem(config_, args, dropout);
  return run_selection(config_, problem).workspace_bytes(problem);
}

Selection DotProductAttention::explain(const AttentionInputs& in, Pass pass, bool wants_dbias,
                                       bool wants_dsoftmax_offset) const {
  AttentionProblem problem =
      build_explain_problem(config_, in, pass, wants_dbias, wants_dsoftmax_offset);
  return select_for(config_, problem);
}

}  // namespace dpa
