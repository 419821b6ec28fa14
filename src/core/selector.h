// The one backend selector (DESIGN.md §6): table-driven, fail-closed, explainable.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "dpa/attention.h"

namespace dpa {

// Each requirement a backend must meet for a request, with a one-line reason when it fails.
std::vector<std::string> rejection_reasons(const FeatureRequest& request,
                                           const Capabilities& capabilities);

// Chooses the first eligible backend of `candidates` (ordered fastest first), or the forced
// one. Never throws: an empty choice is reported in the Selection.
Selection select_backend(const FeatureRequest& request,
                         const std::vector<const Capabilities*>& candidates,
                         std::optional<BackendKind> forced);

// The forced backend for a config: DPA_BACKEND when set, else config.backend unless kAuto.
// Throws kInvalidArgument for an unknown DPA_BACKEND name.
std::optional<BackendKind> forced_backend(BackendKind configured);

// Throws kNotSupported with every backend's reasons when nothing was chosen.
void require_chosen(const Selection& selection);

std::string describe_request(const FeatureRequest& request);

}  // namespace dpa
