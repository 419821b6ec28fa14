// Plumbing (DESIGN.md §9): every value reaches the backend, from the constructor and from a
// per-call override; the forward's RNG state reaches the backward; DPA_LOG goes to stderr.
#include <gtest/gtest.h>

#include <cstdlib>

#include "support/attention_case.h"

namespace dpa::test {
namespace {

CaseSpec small_spec() {
  CaseSpec spec;
  spec.dtype = DType::kFloat32;
  spec.seqlen_q = 9;
  spec.seqlen_kv = 11;
  spec.qk_stddev = 2.0;
  return spec;
}

ForwardArgs forward_args(const CaseTensors& t, HostTensor& o, HostTensor& lse) {
  ForwardArgs args;
  args.in = t.inputs();
  args.o = o.view();
  args.lse = lse.view();
  return args;
}

class Plumbing : public ::testing::TestWithParam<BackendKind> {};

TEST_P(Plumbing, PerCallDropoutOverrideReachesBackend) {
  CaseSpec spec = small_spec();
  spec.config.dropout = 0.5;
  spec.config.backend = GetParam();
  CaseTensors t = make_case(spec);
  HostTensor o(spec.dtype, t.d_o.shape()), lse(DType::kFloat32, {2, 4, 9});
  HostTensor o_eval = o, o_plain = o;
  DotProductAttention attention(spec.config);
  ForwardArgs args = forward_args(t, o, lse);
  ForwardResult first = attention.forward(args);
  ForwardResult second = attention.forward(args);
  EXPECT_EQ(first.rng.offset + 1, second.rng.offset) << "offset advances per dropout call";

  args.o = o_eval.view();
  args.dropout = 0.0;
  attention.forward(args);
  AttentionConfig no_dropout = spec.config;
  no_dropout.dropout = 0.0;
  DotProductAttention plain(no_dropout);
  ForwardArgs plain_args = forward_args(t, o_plain, lse);
  plain.forward(plain_args);
  EXPECT_EQ(relative_error(o_eval, o_plain), 0.0);
  EXPECT_GT(relative_error(o, o_plain), 0.1) << "dropout from the constructor must apply";
}

TEST_P(Plumbing, RngOverrideSelectsTheMask) {
  CaseSpec spec = small_spec();
  spec.config.dropout = 0.4;
  spec.config.backend = GetParam();
  CaseTensors t = make_case(spec);
  HostTensor a(spec.dtype, t.d_o.shape()), b = a, c = a, lse(DType::kFloat32, {2, 4, 9});
  DotProductAttention attention(spec.config);
  ForwardArgs args = forward_args(t, a, lse);
  args.rng = RngState{99, 3};
  attention.forward(args);
  args.o = b.view();
  attention.forward(args);
  args.o = c.view();
  args.rng = RngState{99, 4};
  attention.forward(args);
  EXPECT_EQ(relative_error(a, b), 0.0);
  EXPECT_GT(relative_error(a, c), 0.1);
}

TEST_P(Plumbing, ConfigFeaturesReachBackend) {
  // Each field, set in the constructor, changes the result.
  struct Field {
    const char* name;
    void (*set)(CaseSpec&);
  };
  const Field fields[] = {
      {"softcap", [](CaseSpec& s) { s.config.softcap = 1.0; }},
      {"scale", [](CaseSpec& s) { s.config.scale = 1.0; }},
      {"window", [](CaseSpec& s) { s.config.window_left = 1; }},
      {"bottom_right_diagonal",
       [](CaseSpec& s) {
         s.config.window_left = 1;
         s.config.bottom_right_diagonal = false;
       }},
      {"off_by_one", [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kOffByOne; }},
      {"learnable", [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; }},
      {"post_scale_bias", [](CaseSpec& s) { s.config.bias_type = BiasType::kPostScale; }},
      {"alibi", [](CaseSpec& s) { s.alibi = true; }},
      {"causal", [](CaseSpec& s) { s.config.mask_type = MaskType::kCausal; }},
  };
  CaseSpec base = small_spec();
  base.config.backend = GetParam();
  CaseTensors base_tensors = make_case(base);
  CaseOutputs reference = run_case(base, base_tensors, GetParam(), false);
  for (const Field& field : fields) {
    CaseSpec spec = base;
    field.set(spec);
    if (std::string(field.name) == "bottom_right_diagonal") {
      CaseSpec top_left = spec, bottom_right = spec;
      bottom_right.config.bottom_right_diagonal = true;
      CaseOutputs a = run_case(top_left, make_case(top_left), GetParam(), false);
      CaseOutputs b = run_case(bottom_right, make_case(bottom_right), GetParam(), false);
      EXPECT_GT(relative_error(a.o, b.o), 0.01) << field.name;
      continue;
    }
    CaseOutputs out = run_case(spec, make_case(spec), GetParam(), false);
    EXPECT_GT(relative_error(out.o, reference.o), 1e-3) << field.name;
  }
}

INSTANTIATE_TEST_SUITE_P(HostBackends, Plumbing,
                         ::testing::Values(BackendKind::kCpuExact, BackendKind::kCpu),
                         [](const ::testing::TestParamInfo<BackendKind>& info) {
                           return std::string(to_string(info.param));
                         });

TEST(Logging, DebugPrintsConfigAndRejectionsToStderr) {
  setenv("DPA_LOG", "debug", 1);
  CaseSpec spec = small_spec();
  spec.config.softcap = 3.25;  // a config no other test logs first
  CaseTensors t = make_case(spec);
  ::testing::internal::CaptureStdout();
  ::testing::internal::CaptureStderr();
  run_case(spec, t, BackendKind::kCpuExact, false);
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string out = ::testing::internal::GetCapturedStdout();
  unsetenv("DPA_LOG");
  EXPECT_TRUE(out.empty()) << "library code must not print to stdout";
  EXPECT_NE(err.find("config:"), std::string::npos) << err;
  EXPECT_NE(err.find("softcap"), std::string::npos) << err;
  EXPECT_NE(err.find("not the forced backend"), std::string::npos) << err;
}

// backward_args_for carries everything the backward needs from its forward call.
TEST(BackwardArgsFor, CarriesTheForwardsInputsOutputsAndRngState) {
  double q[8], k[8], v[8], o[8], lse[2], d_o[8], dq[8], dk[8], dv[8];
  auto view = [](double* data, std::initializer_list<int64_t> shape) {
    return TensorView::contiguous(data, DType::kFloat64, shape);
  };
  ForwardArgs forward;
  forward.in.q = view(q, {1, 2, 1, 4});
  forward.in.k = view(k, {1, 2, 1, 4});
  forward.in.v = view(v, {1, 2, 1, 4});
  forward.o = view(o, {1, 2, 1, 4});
  forward.lse = TensorView::contiguous(lse, DType::kFloat32, {1, 1, 2});
  forward.dropout = 0.25;
  int stream_token = 0;
  forward.stream = &stream_token;
  ForwardResult result;
  result.rng = RngState{11, 5};
  const BackwardArgs args =
      backward_args_for(forward, result, view(d_o, {1, 2, 1, 4}), view(dq, {1, 2, 1, 4}),
                        view(dk, {1, 2, 1, 4}), view(dv, {1, 2, 1, 4}));
  EXPECT_EQ(args.in.q.data, q);
  EXPECT_EQ(args.in.v.data, v);
  EXPECT_EQ(args.o.data, o);
  EXPECT_EQ(args.lse.data, lse);
  EXPECT_EQ(args.d_o.data, d_o);
  EXPECT_EQ(args.dq.data, dq);
  EXPECT_EQ(args.dv.data, dv);
  ASSERT_TRUE(args.rng.has_value());
  EXPECT_EQ(args.rng->seed, 11u);
  EXPECT_EQ(args.rng->offset, 5u);
  EXPECT_EQ(args.dropout, 0.25);
  EXPECT_EQ(args.stream, &stream_token);
  EXPECT_EQ(args.dbias.data, nullptr);
}

}  // namespace
}  // namespace dpa::test
