// The non-finite contract on the host backends (docs/decisions.md): -inf logits are masked
// keys, a row with nothing else is an empty row (o = 0, lse = sigma or -inf); a NaN that
// reaches a visible logit makes that row NaN instead of vanishing; config values outside the
// fp32 range and huge windows are handled without crashing or dropping a feature.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "support/attention_case.h"

namespace dpa::test {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// 1 batch, 3 query rows, 4 keys, 2 heads (MHA), d = 4, fp64, post-scale bias [1, 1, 3, 4].
CaseSpec small_spec(SoftmaxType softmax_type) {
  CaseSpec spec;
  spec.batch = 1;
  spec.seqlen_q = 3;
  spec.seqlen_kv = 4;
  spec.heads_q = spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 4;
  spec.config.bias_type = BiasType::kPostScale;
  spec.config.softmax_type = softmax_type;
  spec.bias_shape = {1, 1, 3, 4};
  return spec;
}

// Row i of every head: o[0, i, h, :] and lse[0, h, i].
double o_at(const CaseOutputs& out, int64_t i, int64_t h, int64_t c) {
  return out.o.get(((0 * 3 + i) * 2 + h) * 4 + c);
}
double lse_at(const CaseOutputs& out, int64_t h, int64_t i) { return out.lse.get(h * 3 + i); }

class NonFinite : public ::testing::TestWithParam<BackendKind> {};

TEST_P(NonFinite, RowOfMinusInfinityBiasIsAnEmptyRow) {
  for (SoftmaxType type : {SoftmaxType::kVanilla, SoftmaxType::kOffByOne}) {
    const CaseSpec spec = small_spec(type);
    CaseTensors t = make_case(spec);
    for (int64_t j = 0; j < 4; ++j) t.bias.set(1 * 4 + j, -kInf);  // row 1 sees nothing
    const CaseOutputs out = run_case(spec, t, GetParam(), true);
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(o_at(out, 1, h, c), 0.0);
      EXPECT_EQ(lse_at(out, h, 1), type == SoftmaxType::kVanilla ? -kInf : 0.0);
      EXPECT_TRUE(std::isfinite(lse_at(out, h, 0)));  // the other rows are untouched
    }
    for (int64_t n = 0; n < out.dq.numel(); ++n) ASSERT_TRUE(std::isfinite(out.dq.get(n)));
    for (int64_t n = 0; n < out.dk.numel(); ++n) ASSERT_TRUE(std::isfinite(out.dk.get(n)));
  }
}

TEST_P(NonFinite, NanInQueryPropagatesToItsRowOnly) {
  const CaseSpec spec = small_spec(SoftmaxType::kVanilla);
  CaseTensors t = make_case(spec);
  t.q.set(((0 * 3 + 2) * 2 + 0) * 4 + 1, kNan);  // q[0, 2, head 0, 1]
  const CaseOutputs out = run_case(spec, t, GetParam(), false);
  EXPECT_TRUE(std::isnan(lse_at(out, 0, 2)));
  EXPECT_TRUE(std::isnan(o_at(out, 2, 0, 0)));
  EXPECT_TRUE(std::isfinite(lse_at(out, 0, 1)));
  EXPECT_TRUE(std::isfinite(lse_at(out, 1, 2)));  // the other head
}

TEST_P(NonFinite, NanInARowOfMinusInfinityIsNotMasked) {
  // The case that used to vanish (cpu) or crash (cpu_exact): every other logit is -inf.
  const CaseSpec spec = small_spec(SoftmaxType::kVanilla);
  CaseTensors t = make_case(spec);
  for (int64_t j = 0; j < 4; ++j) t.bias.set(0 * 4 + j, j == 2 ? kNan : -kInf);
  const CaseOutputs out = run_case(spec, t, GetParam(), false);
  for (int64_t h = 0; h < 2; ++h) {
    EXPECT_TRUE(std::isnan(lse_at(out, h, 0)));
    EXPECT_TRUE(std::isnan(o_at(out, 0, h, 3)));
  }
}

TEST_P(NonFinite, WindowsUpToInt64MaxAreUnbounded) {
  CaseSpec spec = small_spec(SoftmaxType::kVanilla);
  spec.config.bias_type = BiasType::kNoBias;
  spec.bias_shape.clear();
  const CaseTensors t = make_case(spec);
  const CaseOutputs unbounded = run_case(spec, t, GetParam(), false);
  spec.config.window_left = spec.config.window_right = std::numeric_limits<int64_t>::max();
  const CaseOutputs huge = run_case(spec, t, GetParam(), false);
  EXPECT_LT(compare_outputs(huge, unbounded).worst(), 1e-12);
}

TEST_P(NonFinite, ExtremeButValidCapsMatchTheOracle) {
  for (double cap : {1e-3, 1e6}) {
    CaseSpec spec = small_spec(SoftmaxType::kOffByOne);
    spec.config.softcap = cap;
    const CaseTensors t = make_case(spec);
    const CaseOutputs got = run_case(spec, t, GetParam(), true);
    const CaseOutputs exact = run_case(spec, t, BackendKind::kCpuExact, true);
    EXPECT_LT(compare_outputs(got, exact).worst(), 1e-5) << "cap " << cap;
  }
}

// Issue 15's valid edge cases: extreme sinks, empty batches and sequences, head dims 1 and 512.
TEST_P(NonFinite, ExtremeSinksMatchTheirLimits) {
  CaseSpec spec = small_spec(SoftmaxType::kLearnable);
  spec.config.bias_type = BiasType::kNoBias;
  spec.bias_shape.clear();
  CaseTensors t = make_case(spec);
  // Head 0: a sink far above every logit takes the whole row (o -> 0, lse = the sink); head 1:
  // -inf and -1e30 turn it off (the vanilla result).
  for (double low : {-kInf, -1e30}) {
    t.softmax_offset.set(0, 1e30);
    t.softmax_offset.set(1, low);
    const CaseOutputs got = run_case(spec, t, GetParam(), true);
    CaseSpec vanilla = spec;
    vanilla.config.softmax_type = SoftmaxType::kVanilla;
    CaseTensors vanilla_tensors = t;
    vanilla_tensors.softmax_offset = HostTensor();
    const CaseOutputs plain = run_case(vanilla, vanilla_tensors, BackendKind::kCpuExact, false);
    for (int64_t i = 0; i < 3; ++i) {
      EXPECT_FLOAT_EQ(lse_at(got, 0, i), 1e30f);
      for (int64_t c = 0; c < 4; ++c) EXPECT_EQ(o_at(got, i, 0, c), 0.0);
      EXPECT_NEAR(lse_at(got, 1, i), lse_at(plain, 1, i), 1e-5);
      for (int64_t c = 0; c < 4; ++c) EXPECT_NEAR(o_at(got, i, 1, c), o_at(plain, i, 1, c), 1e-5);
    }
    for (int64_t n = 0; n < got.dq.numel(); ++n) ASSERT_TRUE(std::isfinite(got.dq.get(n)));
    EXPECT_TRUE(std::isfinite(got.dsoftmax_offset.get(0)));
  }
}

TEST_P(NonFinite, EmptyBatchesAndSequencesAndExtremeHeadDims) {
  struct Shape {
    int64_t batch, sq, skv, d;
  };
  for (const Shape shape : {Shape{0, 3, 4, 4}, Shape{1, 0, 4, 4}, Shape{1, 3, 0, 4},
                            Shape{1, 3, 4, 1}, Shape{1, 3, 4, 512}}) {
    CaseSpec spec = small_spec(SoftmaxType::kOffByOne);
    spec.config.bias_type = BiasType::kNoBias;
    spec.bias_shape.clear();
    spec.batch = shape.batch;
    spec.seqlen_q = shape.sq;
    spec.seqlen_kv = shape.skv;
    spec.head_dim_qk = spec.head_dim_v = shape.d;
    const CaseTensors t = make_case(spec);
    const CaseOutputs got = run_case(spec, t, GetParam(), true);
    const CaseOutputs exact = run_case(spec, t, BackendKind::kCpuExact, true);
    EXPECT_LT(compare_outputs(got, exact).worst(), 1e-5)
        << "b=" << shape.batch << " sq=" << shape.sq << " skv=" << shape.skv << " d=" << shape.d;
    if (shape.skv == 0 && shape.sq > 0) {  // no key: the sink alone, o = 0
      for (int64_t n = 0; n < got.o.numel(); ++n) EXPECT_EQ(got.o.get(n), 0.0);
      for (int64_t n = 0; n < got.lse.numel(); ++n) EXPECT_EQ(got.lse.get(n), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(HostBackends, NonFinite,
                         ::testing::Values(BackendKind::kCpuExact, BackendKind::kCpu),
                         [](const auto& info) { return std::string(to_string(info.param)); });

// Values the fp32 paths cannot represent are refused, naming the field, instead of turning a
// cap into 0 (dropped), NaN or a fully masked result.
TEST(NonFiniteConfig, OutOfRangeCapsAndScalesAreRefused) {
  for (double cap : {1e-46, 1e39, 1e300}) {
    AttentionConfig config;
    config.softcap = cap;
    try {
      DotProductAttention attention(config);
      ADD_FAILURE() << "cap " << cap << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.argument(), "softcap");
    }
  }
  for (double scale : {1e-40, 1e39}) {
    AttentionConfig config;
    config.scale = scale;
    try {
      DotProductAttention attention(config);
      ADD_FAILURE() << "scale " << scale << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.argument(), "scale");
    }
  }
}

TEST(NonFiniteConfig, NonFiniteAlibiSlopesAreRefused) {
  CaseSpec spec = small_spec(SoftmaxType::kVanilla);
  spec.alibi = true;
  for (double bad : {kNan, kInf, -kInf}) {
    CaseTensors t = make_case(spec);
    t.alibi_slopes.set(1, bad);
    try {
      run_case(spec, t, BackendKind::kCpu, false);
      ADD_FAILURE() << "slope " << bad << " accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.argument(), "alibi_slopes");
    }
  }
}

}  // namespace
}  // namespace dpa::test
