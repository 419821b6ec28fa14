// `dpa bench`'s input draws (tools/bench_random.h): the same values on any number of threads,
// and close enough to N(0, stddev^2) that the softmax sees ordinary scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bench_random.h"

namespace dpa::tools {
namespace {

std::vector<float> draws(size_t count, uint64_t seed, float stddev, unsigned threads) {
  std::vector<float> out(count);
  fill_normal(
      out.data(), count, seed, stddev, [](float x) { return x; }, threads);
  return out;
}

TEST(BenchRandom, TheValuesDoNotDependOnTheThreadCount) {
  // Above the one-thread cutoff (a million elements), with a count that splits unevenly.
  const size_t count = (size_t(3) << 20) + 12345;
  const std::vector<float> one = draws(count, 7, 1.f, 1);
  EXPECT_EQ(draws(count, 7, 1.f, 4), one);
  EXPECT_EQ(draws(count, 7, 1.f, 7), one);
  EXPECT_EQ(draws(count, 7, 1.f, 0), one);  // 0 means one thread
  // Enough elements for 16 workers, split two, three and sixteen ways.
  const size_t many = (size_t(17) << 20) + 3;
  const std::vector<float> serial = draws(many, 9, 1.f, 1);
  for (unsigned threads : {2u, 3u, 16u}) EXPECT_EQ(draws(many, 9, 1.f, threads), serial);
  EXPECT_TRUE(draws(0, 9, 1.f, 16).empty());
}

TEST(BenchRandom, DrawsAreApproximatelyNormalWithTheGivenSpread) {
  const float stddev = 1.5f;
  const std::vector<float> x = draws(1 << 21, 3, stddev, 4);
  double sum = 0, squares = 0, fourth = 0;
  float lowest = 0, highest = 0;
  for (float v : x) {
    sum += v;
    squares += double(v) * v;
    fourth += std::pow(double(v) / stddev, 4);
    lowest = std::min(lowest, v);
    highest = std::max(highest, v);
  }
  const double n = double(x.size()), mean = sum / n, variance = squares / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(variance), stddev, 0.01);
  // Irwin-Hall of four uniforms: kurtosis 3 - 6 / 20 = 2.7 (a normal's is 3), bounded by
  // 2 sqrt(3) stddev.
  EXPECT_NEAR(fourth / n, 2.7, 0.05);
  EXPECT_LE(highest, 2 * std::sqrt(3.f) * stddev);
  EXPECT_GE(lowest, -2 * std::sqrt(3.f) * stddev);
  EXPECT_GT(highest, 2.5f * stddev);  // the tails are reached
}

TEST(BenchRandom, SeedsAndNeighboursDiffer) {
  const std::vector<float> a = draws(4096, 1, 1.f, 1), b = draws(4096, 2, 1.f, 1);
  size_t equal = 0, equal_neighbours = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    equal += a[i] == b[i];
    if (i > 0) equal_neighbours += a[i] == a[i - 1];
  }
  EXPECT_LT(equal, 16u);
  EXPECT_LT(equal_neighbours, 16u);
  // Adjacent draws are uncorrelated (the hash of index and index + 1).
  double product = 0, squares = 0;
  for (size_t i = 1; i < a.size(); ++i) {
    product += double(a[i]) * a[i - 1];
    squares += double(a[i]) * a[i];
  }
  EXPECT_LT(std::abs(product / squares), 0.05);
}

}  // namespace
}  // namespace dpa::tools
