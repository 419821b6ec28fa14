// DPA_LOG=info|debug: selection logging to stderr (never stdout), once per distinct config.
#pragma once

#include <string>

#include "core/backend.h"
#include "dpa/arguments.h"
#include "dpa/selection.h"

namespace dpa {

enum class LogLevel : int { kOff = 0, kInfo = 1, kDebug = 2 };

// Reads DPA_LOG on every call so tests and long-lived processes can change it.
LogLevel log_level();

void log_selection(const FeatureRequest& request, const Selection& selection);

}  // namespace dpa
