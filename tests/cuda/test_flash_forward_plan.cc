// The forward plan's rule for softcap with a fixed max (flash_forward_plan.h): it holds for
// bf16 caps up to 50.25 without ALiBi, and nowhere the fixed shift could overflow a P or flush
// a visible key to zero.
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
// -c' shifted by m = c' - 20) is still a normal float, and the largest is 2^20.
TEST(SoftcapFixedMax, TheLargestCapKeepsEveryPNormal) {
  const double cap_log2 = 50.25 * 1.4426950408889634;
  const double m = cap_log2 - 20.0;
  EXPECT_GE(-cap_log2 - m, -125.0);
  EXPECT_DOUBLE_EQ(cap_log2 - m, 20.0);
  EXPECT_LT(-(50.3 * 1.4426950408889634) * 2 + 20.0, -125.0);
}

}  // namespace
}  // namespace dpa::cuda
