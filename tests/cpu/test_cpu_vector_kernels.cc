// The tiled CPU backend's elementwise kernels (src/cpu/tiled_kernels.cc): the vector exponential
// and tanh against the exact functions, their special values, and the same bits from the AVX2
// and the portable 4-wide forms (and from the padded tail); the NaN-keeping maximum; the
// fixed-order sum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/tiled_common.h"

namespace dpa::cpu {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

// Inputs across the whole normal range of exp's results, in steps that are not a multiple of
// any vector width, plus uniform draws where the softmax lives.
std::vector<float> exp_inputs() {
  std::vector<float> x;
  for (float v = -87.3f; v < 88.7f; v += 0.00173f) x.push_back(v);
  std::mt19937 generator(7);
  std::uniform_real_distribution<float> draw(-30.0f, 2.0f);
  for (int i = 0; i < 200001; ++i) x.push_back(draw(generator));
  return x;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }

// The largest error in ulp of results[i] against exact(arguments[i]) over the arguments whose
// exact result is a normal float; a NaN result fails the test (a NaN error would compare false
// and pass unseen).
struct WorstError {
  double ulp = 0.0;
  float argument = 0.0f;
};
WorstError worst_error(const std::vector<float>& arguments, const std::vector<float>& results,
                       double (*exact_function)(double)) {
  WorstError worst;
  for (size_t i = 0; i < arguments.size(); ++i) {
    EXPECT_FALSE(std::isnan(results[i])) << "at " << arguments[i];
    if (std::isnan(results[i])) return {kInfinity, arguments[i]};
    const double exact = exact_function(double(arguments[i]));
    if (std::fabs(exact) < double(std::numeric_limits<float>::min()) || std::fabs(exact) > 3.0e38)
      continue;
    const double ulp = std::ldexp(1.0, std::ilogb(float(exact)) - 23);
    const double error = std::fabs(double(results[i]) - exact) / ulp;
    if (error > worst.ulp) worst = {error, arguments[i]};
  }
  return worst;
}

TEST(CpuVectorKernels, ExpOfShiftedIsWithinTwoUlpOfTheLibrary) {
  const std::vector<float> x = exp_inputs();
  for (const float shift : {0.0f, 3.5f, -1.25f}) {
    std::vector<float> y = x, arguments(x.size());
    exp_of_shifted(y.data(), int64_t(y.size()), shift);
    // The kernel rounds the shifted argument in fp32.
    for (size_t i = 0; i < x.size(); ++i) arguments[i] = x[i] - shift;
    const WorstError worst = worst_error(arguments, y, [](double v) { return std::exp(v); });
    EXPECT_LE(worst.ulp, 2.0) << "shift " << shift << ": worst at exp(" << worst.argument << ")";
  }
}

TEST(CpuVectorKernels, ExpOfShiftedSpecialValues) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {-kInfinity, -1000.0f, -87.34f, kInfinity, 89.0f, 88.75f, nan, 0.0f};
  exp_of_shifted(x.data(), int64_t(x.size()), 0.0f);
  EXPECT_TRUE(same_bits(x[0], 0.0f)) << "masked logits give exactly +0";
  EXPECT_TRUE(same_bits(x[1], 0.0f));
  EXPECT_TRUE(same_bits(x[2], 0.0f)) << "results below 2^-126 flush to 0";
  EXPECT_EQ(x[3], kInfinity);
  EXPECT_EQ(x[4], kInfinity);
  EXPECT_EQ(x[5], kInfinity);
  EXPECT_TRUE(std::isnan(x[6]));
  EXPECT_EQ(x[7], 1.0f);
  // The largest finite result and the smallest normal one stay finite and nonzero.
  std::vector<float> edges = {88.72f, -87.33f};
  exp_of_shifted(edges.data(), 2, 0.0f);
  EXPECT_NEAR(edges[0], std::exp(88.72f), 2e-7 * std::exp(88.72f));
  EXPECT_NEAR(edges[1], std::exp(-87.33f), 2e-7 * std::exp(-87.33f));
}

// Whether exp_of_shifted and sum_in_lanes dispatch to a second (AVX2) width on this CPU; where
// not, the comparisons of the two widths below compare the portable form with itself.
bool has_second_width() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

TEST(CpuVectorKernels, ExpOfShiftedGivesTheSameBitsAtEveryLength) {
  const std::vector<float> x = exp_inputs();
  std::vector<float> dispatched = x, portable = x;
  exp_of_shifted(dispatched.data(), int64_t(x.size()), 0.75f);
  exp_of_shifted_portable(portable.data(), int64_t(x.size()), 0.75f);
  // A tail shorter than a vector takes the same operations as a full vector, at either width.
  for (int64_t n = 1; n <= 17; ++n) {
    std::vector<float> part(x.begin() + 1000, x.begin() + 1000 + n), portable_part = part;
    exp_of_shifted(part.data(), n, 0.75f);
    exp_of_shifted_portable(portable_part.data(), n, 0.75f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_bits(part[size_t(i)], dispatched[size_t(1000 + i)])) << "n " << n;
      ASSERT_TRUE(same_bits(portable_part[size_t(i)], portable[size_t(1000 + i)])) << "n " << n;
    }
  }
}

TEST(CpuVectorKernels, ExpOfShiftedGivesTheSameBitsAtEveryWidth) {
  if (!has_second_width()) GTEST_SKIP() << "this CPU runs the portable width only";
  const std::vector<float> x = exp_inputs();
  std::vector<float> dispatched = x, portable = x;
  exp_of_shifted(dispatched.data(), int64_t(x.size()), 0.75f);
  exp_of_shifted_portable(portable.data(), int64_t(x.size()), 0.75f);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_TRUE(same_bits(dispatched[i], portable[i])) << "exp(" << x[i] << " - 0.75)";
}

// Arguments for tanh: both sides of the switch between its two forms (|y| = 0.625), tiny
// ones, and the range where tanh reaches 1.
std::vector<float> tanh_inputs() {
  std::vector<float> x;
  for (float v = -12.0f; v < 12.0f; v += 0.000917f) x.push_back(v);
  for (float v = 0.6f; v < 0.65f; v = std::nextafter(v, 1.0f)) {
    x.push_back(v);
    x.push_back(-v);
  }
  for (float v = 1e-30f; v < 1e-2f; v *= 1.37f) {
    x.push_back(v);
    x.push_back(-v);
  }
  return x;
}

TEST(CpuVectorKernels, TanhOfScaledIsWithinTwoUlpOfTheExactTanh) {
  const std::vector<float> x = tanh_inputs();
  for (const float scale : {1.0f, 0.02f, 3.0f}) {
    std::vector<float> y = x, arguments(x.size());
    tanh_of_scaled(y.data(), int64_t(y.size()), scale);
    // The kernel rounds the scaled argument in fp32.
    for (size_t i = 0; i < x.size(); ++i) arguments[i] = x[i] * scale;
    const WorstError worst = worst_error(arguments, y, [](double v) { return std::tanh(v); });
    EXPECT_LE(worst.ulp, 2.0) << "scale " << scale << ": worst at tanh(" << worst.argument << ")";
  }
}

TEST(CpuVectorKernels, TanhOfScaledSpecialValues) {
  std::vector<float> x = {kInfinity, -kInfinity, std::numeric_limits<float>::quiet_NaN(),
                          0.0f,      -0.0f,      100.0f};
  tanh_of_scaled(x.data(), int64_t(x.size()), 1.0f);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -1.0f);
  EXPECT_TRUE(std::isnan(x[2]));
  EXPECT_TRUE(same_bits(x[3], 0.0f));
  EXPECT_TRUE(same_bits(x[4], -0.0f));
  EXPECT_EQ(x[5], 1.0f);
}

TEST(CpuVectorKernels, TanhOfScaledGivesTheSameBitsAtEveryWidthAndLength) {
  const std::vector<float> x = tanh_inputs();
  std::vector<float> dispatched = x, portable = x;
  tanh_of_scaled(dispatched.data(), int64_t(x.size()), 0.5f);
  tanh_of_scaled_portable(portable.data(), int64_t(x.size()), 0.5f);
  if (has_second_width()) {
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_TRUE(same_bits(dispatched[i], portable[i])) << "tanh(" << x[i] << " * 0.5)";
  }
  for (int64_t n = 1; n <= 17; ++n) {
    std::vector<float> part(x.begin() + 2000, x.begin() + 2000 + n), portable_part = part;
    tanh_of_scaled(part.data(), n, 0.5f);
    tanh_of_scaled_portable(portable_part.data(), n, 0.5f);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(same_bits(part[size_t(i)], dispatched[size_t(2000 + i)])) << "n " << n;
      ASSERT_TRUE(same_bits(portable_part[size_t(i)], portable[size_t(2000 + i)])) << "n " << n;
    }
  }
}

TEST(CpuVectorKernels, MaxKeepsNaNAndIsExact) {
  std::mt19937 generator(3);
  std::normal_distribution<float> draw(0.0f, 10.0f);
  EXPECT_EQ(max_keeping_nan(nullptr, 0), -kInfinity);
  for (int64_t n = 1; n <= 40; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = draw(generator);
    EXPECT_EQ(max_keeping_nan(x.data(), n), *std::max_element(x.begin(), x.end())) << "n " << n;
    for (int64_t at : {int64_t(0), n / 2, n - 1}) {
      std::vector<float> with_nan = x;
      with_nan[size_t(at)] = std::numeric_limits<float>::quiet_NaN();
      EXPECT_TRUE(std::isnan(max_keeping_nan(with_nan.data(), n))) << "n " << n << " at " << at;
    }
  }
  const std::vector<float> masked(64, -kInfinity);
  EXPECT_EQ(max_keeping_nan(masked.data(), 64), -kInfinity);
}

// The order sum_in_lanes promises: lane l adds x[l], x[l + 8], ... in turn, then a fixed tree.
float sum_in_documented_order(const std::vector<float>& x) {
  float lanes[8] = {};
  for (size_t i = 0; i < x.size(); ++i) lanes[i % 8] += x[i];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

TEST(CpuVectorKernels, SumTakesItsDocumentedOrderAtEveryWidth) {
  std::mt19937 generator(5);
  std::uniform_real_distribution<float> draw(0.0f, 1.0f);
  for (int64_t n = 0; n <= 70; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    // Magnitudes from 1 to 2^11 side by side, so that another order rounds differently.
    for (size_t i = 0; i < x.size(); ++i) x[i] = draw(generator) * float(1 << (i % 12));
    const float expected = sum_in_documented_order(x);
    EXPECT_TRUE(same_bits(sum_in_lanes(x.data(), n), expected)) << "n " << n;
    EXPECT_TRUE(same_bits(sum_in_lanes_portable(x.data(), n), expected)) << "n " << n;
  }
}

}  // namespace
}  // namespace dpa::cpu
