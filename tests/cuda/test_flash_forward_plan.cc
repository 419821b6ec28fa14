// The forward plan's rules for the softmax's shift (flash_forward_plan.h): softcap with a fixed
// max holds for bf16 caps up to 50.25 without ALiBi, and nowhere the fixed shift could overflow
// a P or flush a visible key to zero; the online max's slack keeps an fp16 P with dropout in
// range. The persistent grid's rule.
#include <gtest/gtest.h>

#include <cmath>

#include "cuda/flash/flash_forward_plan.h"

namespace dpa::cuda {
namespace {

TEST(SoftcapFixedMax, TakesBf16CapsUpToFiftyWithoutAlibi) {
  for (double cap : {0.5, 5.0, 30.0, 50.0, 50.25})
    EXPECT_TRUE(softcap_fixed_max_applies(cap, DType::kBFloat16, false)) << cap;
}

TEST(SoftcapFixedMax, RefusesWhereTheShiftCouldLeaveTheRange) {
  EXPECT_FALSE(softcap_fixed_max_applies(0.0, DType::kBFloat16, false));   // no cap: unbounded
  EXPECT_FALSE(softcap_fixed_max_applies(50.3, DType::kBFloat16, false));  // 2^(-2c'+20) < 2^-125
  EXPECT_FALSE(softcap_fixed_max_applies(1000.0, DType::kBFloat16, false));
  EXPECT_FALSE(softcap_fixed_max_applies(30.0, DType::kFloat16, false));  // P up to 2^20 > 65504
  EXPECT_FALSE(softcap_fixed_max_applies(30.0, DType::kBFloat16, true));  // ALiBi lowers rows
}

// The arithmetic behind the bound: at the largest cap taken, the smallest P (the lowest logit
// -c' shifted by m = c' - 64) is 2^-81 or more, far above fp32's smallest normal, and the
// largest is 2^64.
TEST(SoftcapFixedMax, TheLargestCapKeepsEveryPFarFromTheRangesEnds) {
  const double cap_log2 = 50.25 * 1.4426950408889634;
  const double m = cap_log2 - 64.0;
  EXPECT_GE(-cap_log2 - m, -81.0);
  EXPECT_DOUBLE_EQ(cap_log2 - m, 64.0);
}

// The slack lets P reach 2^slack; dropout scales it by 1 / keep_prob. bf16 holds any of that;
// fp16 (largest 65504) gets the full slack of 8 down to keep_prob 2^-6 and less below.
TEST(ForwardMaxSlack, KeepsAnFp16PWithDropoutBelowItsLargestValue) {
  EXPECT_EQ(forward_max_slack(DType::kBFloat16, 0.001), 8.f);
  EXPECT_EQ(forward_max_slack(DType::kFloat16, 1.0), 8.f);
  EXPECT_EQ(forward_max_slack(DType::kFloat16, 0.9), 8.f);
  for (double keep : {0.9, 0.5, 0.01, 0.004, 0.0001, 1e-6}) {
    const float slack = forward_max_slack(DType::kFloat16, keep);
    EXPECT_GE(slack, 0.f) << keep;
    EXPECT_LE(slack, 8.f) << keep;
    if (slack > 0.f) {
      EXPECT_LE(std::exp2(double(slack)) / keep, 65504.0) << keep;
    }
  }
  EXPECT_LT(forward_max_slack(DType::kFloat16, 0.004), 8.f);
  EXPECT_EQ(forward_max_slack(DType::kFloat16, 1e-6), 0.f);
}

// The persistent grid's rule, which the plan and the workspace's count of the dynamic
// scheduler's counter share: the warp-specialised form with one split, nothing else.
TEST(PersistentGrid, WarpSpecialisedWithOneSplitOnly) {
  const FlashTileShape specialised = flash_forward_wgmma_ws_tile_shape(128, 128);
  const FlashTileShape lockstep = flash_forward_wgmma_tile_shape(128, 128);
  EXPECT_TRUE(flash_forward_may_persist(specialised, 1));
  EXPECT_FALSE(flash_forward_may_persist(specialised, 2));
  EXPECT_FALSE(flash_forward_may_persist(lockstep, 1));
  EXPECT_EQ(flash_forward_tile_counter_bytes(specialised, 1), sizeof(int));
  EXPECT_EQ(flash_forward_tile_counter_bytes(specialised, 2), 0u);
  EXPECT_EQ(flash_forward_tile_counter_bytes(lockstep, 1), 0u);
}

}  // namespace
}  // namespace dpa::cuda
