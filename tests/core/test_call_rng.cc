// The one RNG offset rule of DotProductAttention and ContextParallelAttention
// (core/call_rng.h): an object's offset advances only after a call that drew dropout masks
// from the object's own state.
#include <gtest/gtest.h>

#include <optional>

#include "core/call_rng.h"

namespace dpa {
namespace {

TEST(CallRng, OwnStateUsesTheSeedAndTheNextOffset) {
  const RngState state = call_rng_state(std::nullopt, 42, 7);
  EXPECT_EQ(state.seed, 42u);
  EXPECT_EQ(state.offset, 7u);
  const RngState given = call_rng_state(RngState{1, 2}, 42, 7);
  EXPECT_EQ(given.seed, 1u);
  EXPECT_EQ(given.offset, 2u);
}

TEST(CallRng, AdvancesExactlyWhenMasksWereDrawnFromTheOwnState) {
  EXPECT_TRUE(call_advances_offset(std::nullopt, 0.1));
  EXPECT_FALSE(call_advances_offset(std::nullopt, 0.0));
  // Rounds to threshold 0: no mask is drawn, so the offset stays (the CP class used to advance).
  EXPECT_EQ(dropout_threshold(1e-9), 0u);
  EXPECT_FALSE(call_advances_offset(std::nullopt, 1e-9));
  EXPECT_FALSE(call_advances_offset(RngState{1, 2}, 0.1));  // the caller owns the sequence
}

}  // namespace
}  // namespace dpa
