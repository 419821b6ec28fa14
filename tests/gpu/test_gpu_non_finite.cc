// The non-finite contract (docs/decisions.md) on the GPU backends, as tests/cpu/test_non_finite.cc
// checks it on the host: a NaN that reaches a visible logit makes its row NaN, also when every
// logit of the row is NaN or the row's other logits are -inf (the case a max that drops NaN
// reads as an empty row), and also through cuda_flash's split-KV merge (decode shapes).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "gpu/device_case.h"

namespace dpa::test {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// 1 batch, 2 heads (MHA), head dim 64, fp16.
CaseSpec nan_spec(int64_t seqlen_q, int64_t seqlen_kv) {
  CaseSpec spec;
  spec.dtype = DType::kFloat16;
  spec.batch = 1;
  spec.seqlen_q = seqlen_q;
  spec.seqlen_kv = seqlen_kv;
  spec.heads_q = spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 64;
  return spec;
}

// Layouts of run_device_case's outputs: o [1, sq, 2, 64], lse [1, 2, sq].
double lse_at(const CaseOutputs& out, const CaseSpec& spec, int64_t h, int64_t i) {
  return out.lse.get(h * spec.seqlen_q + i);
}
double o_at(const CaseOutputs& out, int64_t i, int64_t h, int64_t c) {
  return out.o.get((i * 2 + h) * 64 + c);
}

class GpuNonFinite : public ::testing::TestWithParam<BackendKind> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

TEST_P(GpuNonFinite, AllNanRowIsNanAndTheOthersAreNot) {
  const CaseSpec spec = nan_spec(8, 16);
  CaseTensors t = make_case(spec);
  for (int64_t c = 0; c < 64; ++c) t.q.set((1 * 2 + 0) * 64 + c, kNan);  // q[0, 1, head 0, :]
  const CaseOutputs out = run_device_case(spec, t, GetParam(), /*backward=*/false);
  EXPECT_TRUE(std::isnan(lse_at(out, spec, 0, 1)));
  for (int64_t c = 0; c < 64; ++c) ASSERT_TRUE(std::isnan(o_at(out, 1, 0, c))) << c;
  for (int64_t i = 0; i < 8; ++i) {
    if (i != 1) {
      EXPECT_TRUE(std::isfinite(lse_at(out, spec, 0, i))) << i;
    }
    EXPECT_TRUE(std::isfinite(lse_at(out, spec, 1, i))) << i;  // the other head
  }
}

TEST_P(GpuNonFinite, NanKeyMakesEveryRowThatSeesItNan) {
  const CaseSpec spec = nan_spec(8, 16);
  CaseTensors t = make_case(spec);
  t.k.set((4 * 2 + 1) * 64 + 0, kNan);  // k[0, 4, head 1, 0]
  const CaseOutputs out = run_device_case(spec, t, GetParam(), /*backward=*/false);
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(std::isnan(lse_at(out, spec, 1, i))) << i;
    EXPECT_TRUE(std::isfinite(lse_at(out, spec, 0, i))) << i;
  }
}

TEST_P(GpuNonFinite, AllNanRowStaysNanThroughManyKeyTiles) {
  // One query row against 8192 keys: cuda_flash's decode shape, split over the keys and merged.
  const CaseSpec spec = nan_spec(1, 8192);
  CaseTensors t = make_case(spec);
  for (int64_t c = 0; c < 64; ++c) t.q.set(0 * 64 + c, kNan);  // q[0, 0, head 0, :]
  const CaseOutputs out = run_device_case(spec, t, GetParam(), /*backward=*/false);
  EXPECT_TRUE(std::isnan(lse_at(out, spec, 0, 0)));
  EXPECT_TRUE(std::isnan(o_at(out, 0, 0, 0)));
  EXPECT_TRUE(std::isfinite(lse_at(out, spec, 1, 0)));
  EXPECT_TRUE(std::isfinite(o_at(out, 0, 1, 0)));
}

INSTANTIATE_TEST_SUITE_P(Backends, GpuNonFinite,
                         ::testing::Values(BackendKind::kCudaFlash, BackendKind::kCudaUnfused),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return std::string(info.param == BackendKind::kCudaFlash
                                                  ? "cuda_flash"
                                                  : "cuda_unfused");
                         });

// A bias is cuda_unfused's alone: a NaN among -inf logits must not read as an empty row, and an
// all -inf row is empty (o = 0, lse = -inf).
TEST(GpuNonFiniteBias, NanAmongMinusInfinityIsNotMasked) {
  std::string why;
  if (!gpu_present(&why)) GTEST_SKIP() << why;
  CaseSpec spec = nan_spec(8, 16);
  spec.config.bias_type = BiasType::kPostScale;
  spec.bias_shape = {1, 1, 8, 16};
  CaseTensors t = make_case(spec);
  for (int64_t j = 0; j < 16; ++j) {
    t.bias.set(3 * 16 + j, -kInf);                  // row 3 sees nothing
    t.bias.set(5 * 16 + j, j == 7 ? kNan : -kInf);  // row 5: a NaN among -inf
  }
  const CaseOutputs out = run_device_case(spec, t, BackendKind::kCudaUnfused, /*backward=*/false);
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_EQ(lse_at(out, spec, h, 3), -kInf);
    EXPECT_EQ(o_at(out, 3, h, 0), 0.0);
    EXPECT_TRUE(std::isnan(lse_at(out, spec, h, 5)));
    EXPECT_TRUE(std::isnan(o_at(out, 5, h, 0)));
    EXPECT_TRUE(std::isfinite(lse_at(out, spec, h, 0)));
  }
}

}  // namespace
}  // namespace dpa::test
