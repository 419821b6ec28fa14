// What the selector decided and why (DESIGN.md §6): one verdict per backend. Returned by
// DotProductAttention::explain(); printed by DPA_LOG and `dpa explain`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dpa/types.h"

namespace dpa {

// Why a backend was or was not chosen.
struct BackendVerdict {
  BackendKind backend = BackendKind::kAuto;
  bool eligible = false;
  std::vector<std::string> reasons;  // one line per failed requirement; empty when eligible
  std::string plan;  // eligible: what it would run (kernel family, tiles) where it says
};

struct Selection {
  std::optional<BackendKind> chosen;  // nullopt: nothing eligible
  bool forced = false;                // config.backend (or DPA_BACKEND) named it
  std::vector<BackendVerdict> verdicts;
  std::string to_string() const;  // human-readable, one backend per block
};

}  // namespace dpa
