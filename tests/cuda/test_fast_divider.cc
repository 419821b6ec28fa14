// FastDivider (src/cuda/fast_divider.h), the backward's division of an iteration by the query
// tiles per head: exact against `/` over every divisor up to 1024 and every n up to 2^15, and
// at the ends of the range (n up to 2^31 - 1, divisors up to 2^31 - 1).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "cuda/fast_divider.h"

namespace dpa::cuda {
namespace {

TEST(FastDivider, MatchesDivisionForSmallDivisorsAndCounts) {
  for (int d = 1; d <= 1024; ++d) {
    const FastDivider divider(d);
    for (int n = 0; n < (1 << 15); ++n) ASSERT_EQ(divider.quotient(n), n / d) << n << " / " << d;
  }
}

TEST(FastDivider, MatchesDivisionAtTheEndsOfTheRange) {
  constexpr int kMax = std::numeric_limits<int>::max();
  std::vector<int> divisors = {
      1,        2,   3, 7, 64, 127, 128, 129, 1000003, (1 << 30) - 1, 1 << 30, (1 << 30) + 1,
      kMax - 1, kMax};
  for (int s = 1; s < 31; ++s) {
    divisors.push_back((1 << s) - 1);
    divisors.push_back(1 << s);
    divisors.push_back((1 << s) + 1);
  }
  for (const int d : divisors) {
    const FastDivider divider(d);
    for (const int64_t base : {int64_t(0), int64_t(d) - 1, int64_t(d), int64_t(1) << 20,
                               int64_t(kMax) - 70000, int64_t(kMax / d) * d - 1}) {
      for (int64_t n = base; n < base + 70000 && n <= kMax; ++n) {
        if (n < 0) continue;
        ASSERT_EQ(divider.quotient(int(n)), int(n / d)) << n << " / " << d;
      }
    }
  }
}

}  // namespace
}  // namespace dpa::cuda
