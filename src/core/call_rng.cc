#include "core/call_rng.h"

namespace dpa {

// Out of line: inlined into callers that pass std::nullopt, gcc 12 under ASan warns that the
// empty optional's payload "may be used uninitialized" (-Wmaybe-uninitialized, a false alarm).
RngState call_rng_state(const std::optional<RngState>& given, uint64_t seed, uint64_t next_offset) {
  if (given) return *given;
  return RngState{seed, next_offset};
}

}  // namespace dpa
