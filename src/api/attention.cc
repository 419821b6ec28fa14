// DotProductAttention: API -> validate -> select -> backend (DESIGN.md §1).
#include "dpa/attention.h"

#include "core/backend.h"
#include "core/logging.h"
#include "core/problem_builder.h"
#include "core/selector.h"

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

}  // namespace

DotProductAttention::DotProductAttention(const AttentionConfig& config) : config_(config) {
  validate_config(config_);
}

ForwardResult DotProductAttention::forward(const ForwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  const RngState rng = args.rng.value_or(RngState{config_.seed, next_offset_});
  AttentionProblem problem = build_forward_problem(config_, args, dropout, rng);
  const Backend& backend = run_selection(config_, problem);
  backend.forward(problem);
  // Each call that draws dropout from the object's own state gets a fresh offset.
  if (!args.rng && problem.dropout_threshold > 0) ++next_offset_;
  return {backend.capabilities().kind, rng};
}

BackendKind DotProductAttention::backward(const BackwardArgs& args) {
  const double dropout = args.dropout.value_or(config_.dropout);
  AttentionProblem problem = build_backward_problem(config_, args, dropout);
  const Backend& backend = run_selection(config_, problem);
  backend.backward(problem);
  return backend.capabilities().kind;
}

Selection DotProductAttention::explain(const AttentionInputs& in, Pass pass, bool wants_dbias,
                                       bool wants_dsoftmax_offset) const {
  AttentionProblem problem =
      build_explain_problem(config_, in, pass, wants_dbias, wants_dsoftmax_offset);
  return select_for(config_, problem);
}

}  // namespace dpa
