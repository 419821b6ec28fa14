// The one backend selector (DESIGN.md §6): table-driven, fail-closed, explainable.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "dpa/arguments.h"
#include "dpa/selection.h"

namespace dpa {

// Each requirement a backend must meet for a request, with a one-line reason when it fails.
std::vector<std::string> rejection_reasons(const FeatureRequest& request,
                                           const Capabilities& capabilities);

// Which verdicts a selection holds: every candidate's (explain, the debug log, the error that
// lists every backend's reasons), or only those up to the chosen one. A call needs no more than
// that, and a later candidate's rules can cost a device query (cuda_unfused's free memory).
enum class Verdicts { kEveryBackend, kUntilChosen };

// Chooses the first eligible backend of `candidates` (ordered fastest first), or the forced
// one. Never throws: an empty choice is reported in the Selection, with every verdict.
Selection select_backend(const FeatureRequest& request,
                         const std::vector<const Capabilities*>& candidates,
                         std::optional<BackendKind> forced,
                         Verdicts verdicts = Verdicts::kEveryBackend);

// The forced backend for a config: config.backend unless kAuto (DPA_BACKEND reaches it
// through core/environment.h, at construction).
std::optional<BackendKind> forced_backend(BackendKind configured);

// Throws kNotSupported with every backend's reasons when nothing was chosen.
void require_chosen(const Selection& selection);

std::string describe_request(const FeatureRequest& request);

// The selection for a validated problem among `backends` (fastest first): the request made
// from the problem, the config's forced backend, every backend's verdict. `with_plans` adds
// each eligible backend's plan (Capabilities::describe_plan) for explain(); calls skip it, so
// no string is built on the call path.
Selection select_for_problem(const AttentionConfig& config, const AttentionProblem& problem,
                             const std::vector<const Backend*>& backends,
                             FeatureRequest* request_out = nullptr, bool with_plans = false,
                             Verdicts verdicts = Verdicts::kEveryBackend);

// The backend a call runs: selects, logs the selection (DPA_LOG) and fails closed (throws
// kNotSupported with every backend's reasons when none is eligible). The one choice that the
// API and the context-parallel tiles both make.
const Backend& choose_backend(const AttentionConfig& config, const AttentionProblem& problem,
                              const std::vector<const Backend*>& backends);

}  // namespace dpa
