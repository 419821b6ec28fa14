// The RNG state of one call, and the offset rule that DotProductAttention and
// ContextParallelAttention share (DESIGN.md §5). A call without args.rng draws from
// (config.seed, the object's next offset); that offset advances exactly when such a call drew
// dropout masks, so no two calls reuse masks and calls without dropout (or with a probability
// that rounds to threshold 0, which draws none) leave the sequence alone.
#pragma once

#include <cstdint>
#include <optional>

#include "core/philox.h"
#include "dpa/config.h"

namespace dpa {

RngState call_rng_state(const std::optional<RngState>& given, uint64_t seed, uint64_t next_offset);

// Call after the call succeeded (the dropout probability is validated by then).
inline bool call_advances_offset(const std::optional<RngState>& given, double dropout) {
  return !given && dropout_threshold(dropout) > 0;
}

}  // namespace dpa
