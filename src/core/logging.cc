#include "core/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string_view>

#include "core/selector.h"

namespace dpa {

LogLevel log_level() {
  const char* value = std::getenv("DPA_LOG");
  if (!value) return LogLevel::kOff;
  std::string_view level(value);
  if (level == "debug") return LogLevel::kDebug;
  if (level == "info") return LogLevel::kInfo;
  return LogLevel::kOff;
}

void log_selection(const FeatureRequest& request, const Selection& selection) {
  const LogLevel level = log_level();
  if (level == LogLevel::kOff) return;
  static std::mutex mutex;
  static std::set<std::string> seen;
  const std::string config = describe_request(request);
  const std::string chosen =
      selection.chosen ? std::string(to_string(*selection.chosen)) : std::string("none");
  std::lock_guard<std::mutex> lock(mutex);
  if (!seen.insert(std::to_string(int(level)) + chosen + config).second) return;
  if (level == LogLevel::kInfo) {
    std::fprintf(stderr, "[dpa] backend %s\n", chosen.c_str());
  } else {
    std::fprintf(stderr, "[dpa] config: %s\n[dpa] %s", config.c_str(),
                 selection.to_string().c_str());
  }
}

}  // namespace dpa
