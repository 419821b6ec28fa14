// The harness can fail: poisoned device memory reads back as NaN in every output dtype, and the
// comparison rejects an unwritten element, an o that is off by more than its tolerance and an
// LSE that is off by more than its tolerance (DESIGN.md §9: tests prove they can fail).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "gpu/device_case.h"

namespace dpa::test {
namespace {

TEST(GpuHarness, PoisonedDeviceMemoryReadsAsNan) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    DeviceTensor tensor(dtype, {3, 5, 7});
    const HostTensor host = tensor.download();
    for (int64_t i = 0; i < host.numel(); ++i)
      ASSERT_TRUE(std::isnan(host.get(i))) << to_string(dtype) << " element " << i;
  }
}

// The messages of the failures `body` reports (intercepted: they do not fail this test).
std::vector<std::string> failures_of(const std::function<void()>& body) {
  ::testing::TestPartResultArray results;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &results);
    body();
  }
  std::vector<std::string> messages;
  for (int i = 0; i < results.size(); ++i)
    messages.push_back(results.GetTestPartResult(i).message());
  return messages;
}

bool any_contains(const std::vector<std::string>& messages, const std::string& text) {
  for (const std::string& message : messages)
    if (message.find(text) != std::string::npos) return true;
  return false;
}

// A small bf16 case and its cpu_exact outputs (no GPU needed).
struct SmallCase {
  CaseSpec spec;
  CaseOutputs reference;
  SmallCase() {
    spec.dtype = DType::kBFloat16;
    spec.batch = 1;
    spec.seqlen_q = 9;
    spec.seqlen_kv = 13;
    spec.heads_q = 2;
    spec.heads_kv = 1;
    spec.head_dim_qk = spec.head_dim_v = 16;
    spec.config.mask_type = MaskType::kCausal;  // row 0 sees one key
    reference = run_case(spec, make_case(spec), BackendKind::kCpuExact, true);
  }
};

TEST(GpuHarness, ComparisonAcceptsTheReferenceItself) {
  const SmallCase c;
  EXPECT_TRUE(failures_of([&] {
                expect_matches_reference(c.reference, c.reference, c.spec.dtype, true, "identity");
              }).empty());
}

TEST(GpuHarness, ComparisonRejectsAnUnwrittenElement) {
  const SmallCase c;
  CaseOutputs got = c.reference;
  got.o.set(5, std::nan(""));
  EXPECT_TRUE(any_contains(
      failures_of([&] { expect_matches_reference(got, c.reference, c.spec.dtype, false, "nan"); }),
      "o has NaN"));
  got = c.reference;
  got.dk.set(3, std::nan(""));
  EXPECT_TRUE(any_contains(
      failures_of([&] { expect_matches_reference(got, c.reference, c.spec.dtype, true, "nan"); }),
      "dk has NaN"));
}

TEST(GpuHarness, ComparisonRejectsAnOutputBeyondItsTolerance) {
  const SmallCase c;
  CaseOutputs got = c.reference;
  // 10% larger: five times the bf16 o tolerance.
  for (int64_t i = 0; i < got.o.numel(); ++i) got.o.set(i, got.o.get(i) * 1.1);
  EXPECT_TRUE(any_contains(
      failures_of([&] { expect_matches_reference(got, c.reference, c.spec.dtype, false, "o"); }),
      "o relative error"));
}

TEST(GpuHarness, ComparisonRejectsAnLseBeyondItsTolerance) {
  const SmallCase c;
  CaseOutputs got = c.reference;
  got.lse.set(4, got.lse.get(4) + 0.05);  // ten times the absolute tolerance near |lse| ~ 3
  EXPECT_TRUE(any_contains(
      failures_of([&] { expect_matches_reference(got, c.reference, c.spec.dtype, false, "lse"); }),
      "lse differs"));
}

}  // namespace
}  // namespace dpa::test
