// The oracle itself: closed-form cases worked by hand, and fp64 finite differences of every
// gradient of cpu_exact (q, k, v, bias, sink offsets) with each feature switched on.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cpu/thread_pool.h"
#include "support/attention_case.h"

namespace dpa::test {
namespace {

// The oracle runs its heads as thread-pool tasks: the same bits for any thread count, with
// the backward's tasks per KV head (GQA 6 / 3) and with dbias (one task).
TEST(ExactReference, BitIdenticalForAnyThreadCount) {
  for (const bool with_dbias : {false, true}) {
    CaseSpec spec;
    spec.batch = 2;
    spec.heads_q = 6;
    spec.heads_kv = 3;
    spec.seqlen_q = 37;
    spec.seqlen_kv = 45;
    spec.config.mask_type = MaskType::kCausalBottomRight;
    spec.config.softcap = 3.0;
    spec.config.softmax_type = SoftmaxType::kLearnable;
    spec.config.dropout = 0.1;
    if (with_dbias) {
      spec.config.bias_type = BiasType::kPostScale;
      spec.bias_shape = {1, 1, 37, 45};  // dbias sums over b and h
    }
    const CaseTensors tensors = make_case(spec);
    cpu::set_num_threads(1);
    const std::vector<unsigned char> serial =
        bytes_of(run_case(spec, tensors, BackendKind::kCpuExact));
    for (const int threads : {2, 5}) {
      cpu::set_num_threads(threads);
      EXPECT_EQ(bytes_of(run_case(spec, tensors, BackendKind::kCpuExact)), serial)
          << threads << " threads, dbias " << with_dbias;
    }
    cpu::set_num_threads(0);
  }
}

// b = 1, H = G = 1, d = 1, sq = skv = 2, scale 1, cap 1, learnable sink 0.5.
// Row i: u = q_i * k_j; s = tanh(u); P_j = e^{s_j} / (e^{s_0} + e^{s_1} + e^{0.5}).
TEST(ExactReference, ClosedFormTwoByTwoWithCapAndSink) {
  CaseSpec spec;
  spec.config.softcap = 1.0;
  spec.config.scale = 1.0;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  spec.batch = 1;
  spec.seqlen_q = spec.seqlen_kv = 2;
  spec.heads_q = spec.heads_kv = 1;
  spec.head_dim_qk = spec.head_dim_v = 1;
  CaseTensors t = make_case(spec);
  t.q = HostTensor::from_values(DType::kFloat64, {1, 2, 1, 1}, {2.0, 0.5});
  t.k = HostTensor::from_values(DType::kFloat64, {1, 2, 1, 1}, {1.0, -1.0});
  t.v = HostTensor::from_values(DType::kFloat64, {1, 2, 1, 1}, {1.0, 3.0});
  t.d_o = HostTensor::from_values(DType::kFloat64, {1, 2, 1, 1}, {1.0, -2.0});
  t.softmax_offset = HostTensor::from_values(DType::kFloat32, {1}, {0.5});
  CaseOutputs out = run_case(spec, t, BackendKind::kCpuExact);

  double dalpha = 0.0;
  for (int i = 0; i < 2; ++i) {
    const double q = i == 0 ? 2.0 : 0.5;
    const double s0 = std::tanh(q * 1.0), s1 = std::tanh(q * -1.0);
    const double z = std::exp(s0) + std::exp(s1) + std::exp(0.5);
    const double p0 = std::exp(s0) / z, p1 = std::exp(s1) / z;
    const double o = p0 * 1.0 + p1 * 3.0;
    EXPECT_NEAR(out.o.get(i), o, 1e-12) << "row " << i;
    EXPECT_NEAR(out.lse.get(i), std::log(z), 1e-6) << "row " << i;  // lse is fp32
    const double d_o = i == 0 ? 1.0 : -2.0;
    dalpha += -std::exp(0.5) / z * d_o * o;
    // dq_i = sum_j P_j (dO v_j - D) (1 - tanh^2(u_j)) k_j
    const double big_d = d_o * o;
    const double dq = p0 * (d_o * 1.0 - big_d) * (1 - s0 * s0) * 1.0 +
                      p1 * (d_o * 3.0 - big_d) * (1 - s1 * s1) * -1.0;
    EXPECT_NEAR(out.dq.get(i), dq, 1e-12) << "row " << i;
  }
  EXPECT_NEAR(out.dsoftmax_offset.get(0), dalpha, 1e-6);
}

// A row that sees no key: o = 0, LSE = sink logit (or -inf), gradients finite.
TEST(ExactReference, FullyMaskedRowsGiveZeroNotNaN) {
  for (SoftmaxType softmax : {SoftmaxType::kVanilla, SoftmaxType::kOffByOne}) {
    CaseSpec spec;
    spec.config.mask_type = MaskType::kPadding;
    spec.config.softmax_type = softmax;
    spec.lengths_q = {5, 3};
    spec.lengths_kv = {7, 0};  // batch 1 has no keys at all
    CaseTensors t = make_case(spec);
    CaseOutputs out = run_case(spec, t, BackendKind::kCpuExact);
    ASSERT_FALSE(has_nan(out.o));
    ASSERT_FALSE(has_nan(out.dq));
    ASSERT_FALSE(has_nan(out.dk));
    const int64_t sq = spec.seqlen_q, h = spec.heads_q, d = spec.head_dim_v;
    for (int64_t i = 0; i < sq; ++i)
      for (int64_t head = 0; head < h; ++head) {
        EXPECT_EQ(out.o.get(((1 * sq + i) * h + head) * d), 0.0);
        const double lse = out.lse.get((1 * h + head) * sq + i);
        if (softmax == SoftmaxType::kVanilla)
          EXPECT_TRUE(std::isinf(lse) && lse < 0);
        else
          EXPECT_EQ(lse, 0.0);
      }
  }
}

// Loss L = sum(dO * o); central differences against the analytic gradients.
struct GradientCheck {
  std::string name;
  std::function<void(CaseSpec&)> configure;
};

double loss(const CaseSpec& spec, const CaseTensors& t) {
  CaseOutputs out = run_case(spec, t, BackendKind::kCpuExact, false);
  double sum = 0.0;
  for (int64_t i = 0; i < out.o.numel(); ++i) sum += out.o.get(i) * t.d_o.get(i);
  return sum;
}

void check_tensor_gradient(const CaseSpec& spec, CaseTensors& t, HostTensor CaseTensors::*input,
                           const HostTensor& analytic, const char* name) {
  ASSERT_TRUE(analytic.defined()) << name;
  HostTensor& x = t.*input;
  // fp32 parameters (sink offsets) are perturbed with a larger step.
  const double step = x.dtype() == DType::kFloat32 ? 1e-2 : 1e-6;
  const double tolerance = x.dtype() == DType::kFloat32 ? 2e-3 : 1e-6;
  double worst = 0.0, scale = 0.0;
  for (int64_t n = 0; n < x.numel(); ++n) {
    const double original = x.get(n);
    x.set(n, original + step);
    const double plus_step = x.get(n) - original;
    const double up = loss(spec, t);
    x.set(n, original - step);
    const double minus_step = original - x.get(n);
    const double down = loss(spec, t);
    x.set(n, original);
    const double numeric = (up - down) / (plus_step + minus_step);
    worst = std::max(worst, std::fabs(numeric - analytic.get(n)));
    scale = std::max(scale, std::fabs(analytic.get(n)));
  }
  EXPECT_GT(scale, 0.0) << name << " gradient is identically zero: the check cannot fail";
  EXPECT_LE(worst, tolerance * std::max(1.0, scale)) << name;
}

void PrintTo(const GradientCheck& check, std::ostream* os) { *os << check.name; }

class ExactGradients : public ::testing::TestWithParam<GradientCheck> {};

TEST_P(ExactGradients, MatchFiniteDifferences) {
  CaseSpec spec;
  spec.batch = 2;
  spec.seqlen_q = 4;
  spec.seqlen_kv = 6;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim_qk = 3;
  spec.head_dim_v = 2;
  spec.qk_stddev = 1.5;
  CaseSpec plain = spec;
  GetParam().configure(spec);
  CaseTensors t = make_case(spec);
  CaseOutputs analytic = run_case(spec, t, BackendKind::kCpuExact);
  if (GetParam().name != "plain") {
    // The feature must move the reference far beyond the tolerance, or the check is blind to
    // it. The baseline keeps the layout (thd lengths) and drops the features; make_case draws
    // q, k, v, dO first, so both runs see the same values.
    plain.config.format = spec.config.format;
    plain.lengths_q = spec.lengths_q;
    plain.lengths_kv = spec.lengths_kv;
    plain.gaps_q = spec.gaps_q;
    plain.gaps_kv = spec.gaps_kv;
    if (!spec.lengths_q.empty()) plain.config.mask_type = MaskType::kPadding;
    CaseOutputs baseline = run_case(plain, make_case(plain), BackendKind::kCpuExact);
    EXPECT_GT(compare_outputs(analytic, baseline).worst(), 1e-2);
    EXPECT_GT(relative_error(analytic.o, baseline.o), 1e-3) << "the feature barely moves o";
  }
  check_tensor_gradient(spec, t, &CaseTensors::q, analytic.dq, "dq");
  check_tensor_gradient(spec, t, &CaseTensors::k, analytic.dk, "dk");
  check_tensor_gradient(spec, t, &CaseTensors::v, analytic.dv, "dv");
  if (t.bias.defined()) check_tensor_gradient(spec, t, &CaseTensors::bias, analytic.dbias, "dbias");
  if (t.softmax_offset.defined())
    check_tensor_gradient(spec, t, &CaseTensors::softmax_offset, analytic.dsoftmax_offset,
                          "dsoftmax_offset");
}

INSTANTIATE_TEST_SUITE_P(
    Features, ExactGradients,
    ::testing::Values(GradientCheck{"plain", [](CaseSpec&) {}},
                      GradientCheck{"softcap",
                                    [](CaseSpec& s) {
                                      s.config.softcap = 0.7;
                                      s.qk_stddev = 2.5;
                                    }},
                      GradientCheck{"learnable_sink_softcap",
                                    [](CaseSpec& s) {
                                      s.config.softmax_type = SoftmaxType::kLearnable;
                                      s.config.softcap = 2.0;
                                      s.sink_stddev = 1.0;
                                    }},
                      GradientCheck{"off_by_one_causal",
                                    [](CaseSpec& s) {
                                      s.config.softmax_type = SoftmaxType::kOffByOne;
                                      s.config.mask_type = MaskType::kCausal;
                                    }},
                      GradientCheck{"pre_scale_bias_broadcast",
                                    [](CaseSpec& s) {
                                      s.config.bias_type = BiasType::kPreScale;
                                      s.config.softcap = 1.5;
                                      s.bias_shape = {1, 4, 1, 6};
                                    }},
                      GradientCheck{"post_scale_bias_full",
                                    [](CaseSpec& s) {
                                      s.config.bias_type = BiasType::kPostScale;
                                      s.config.softcap = 1.5;
                                      s.bias_shape = {2, 4, 4, 6};
                                    }},
                      GradientCheck{"alibi_sink_window",
                                    [](CaseSpec& s) {
                                      s.alibi = true;
                                      s.config.softmax_type = SoftmaxType::kLearnable;
                                      s.sink_stddev = 1.0;
                                      s.config.window_left = 2;
                                      s.config.window_right = 1;
                                    }},
                      GradientCheck{"causal_bottom_right_window",
                                    [](CaseSpec& s) {
                                      s.config.mask_type = MaskType::kCausalBottomRight;
                                      s.config.window_left = 2;
                                    }},
                      GradientCheck{"dropout_softcap_sink",
                                    [](CaseSpec& s) {
                                      s.config.dropout = 0.3;
                                      s.config.seed = 1234;
                                      s.config.softcap = 1.0;
                                      s.config.softmax_type = SoftmaxType::kLearnable;
                                      s.sink_stddev = 1.0;
                                    }},
                      GradientCheck{"thd_padded_gqa",
                                    [](CaseSpec& s) {
                                      s.config.format = Format::kTHD;
                                      s.config.mask_type = MaskType::kPaddingCausalBottomRight;
                                      s.lengths_q = {3, 0, 2};
                                      s.lengths_kv = {4, 2, 5};
                                      s.gaps_q = {1, 0, 2};
                                      s.gaps_kv = {0, 1, 1};
                                      s.config.softcap = 1.0;
                                    }},
                      GradientCheck{"arbitrary_mask_sbhd",
                                    [](CaseSpec& s) {
                                      s.config.format = Format::kSBHD;
                                      s.config.mask_type = MaskType::kArbitrary;
                                      s.config.softmax_type = SoftmaxType::kOffByOne;
                                    }}),
    [](const ::testing::TestParamInfo<GradientCheck>& info) { return info.param.name; });

}  // namespace
}  // namespace dpa::test
