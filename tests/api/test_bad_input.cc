// Bad input (DESIGN.md §7): every case raises dpa::Error naming the argument, before any work,
// and leaves the outputs untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <ostream>
#include <string>

#include "support/attention_case.h"

namespace dpa::test {
namespace {

constexpr double kSentinel = 12345.0;

struct BadInput {
  std::string name;
  std::string argument;                                  // the name the error must carry
  std::function<void(CaseSpec&)> configure;              // applied before make_case
  std::function<void(CaseSpec&, CaseTensors&)> corrupt;  // applied after make_case
  bool backward = false;
};

void no_change(CaseSpec&) {}
void no_tensor_change(CaseSpec&, CaseTensors&) {}

void PrintTo(const BadInput& bad, std::ostream* os) { *os << bad.name; }

class Validation : public ::testing::TestWithParam<BadInput> {};

TEST_P(Validation, RejectsNamingTheArgumentAndWritesNothing) {
  const BadInput& bad = GetParam();
  CaseSpec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  bad.configure(spec);
  CaseTensors t;
  try {
    t = make_case(spec);
  } catch (const Error& error) {
    FAIL() << "fixture threw: " << error.what();
  }
  bad.corrupt(spec, t);

  HostTensor o(spec.dtype, t.d_o.shape());
  o.fill(kSentinel);
  HostTensor lse(DType::kFloat32, {spec.batch, spec.heads_q, spec.seqlen_q});
  if (spec.config.format == Format::kTHD)
    lse = HostTensor(DType::kFloat32, {spec.heads_q, t.q.shape()[0]});
  lse.fill(kSentinel);
  HostTensor dq(spec.dtype, t.q.shape()), dk(spec.dtype, t.k.shape()), dv(spec.dtype, t.v.shape());
  dq.fill(kSentinel);
  dk.fill(kSentinel);
  dv.fill(kSentinel);

  try {
    DotProductAttention attention(spec.config);
    if (!bad.backward) {
      ForwardArgs args;
      args.in = t.inputs();
      args.o = o.view();
      args.lse = lse.view();
      if (bad.name == "per_call_dropout") args.dropout = 1.5;
      attention.forward(args);
    } else {
      BackwardArgs args;
      args.in = t.inputs();
      args.o = o.view();
      args.lse = lse.view();
      args.d_o = t.d_o.view();
      args.dq = dq.view();
      args.dk = dk.view();
      args.dv = dv.view();
      if (bad.name == "dbias_without_bias") args.dbias = dq.view();
      if (bad.name == "dsoftmax_offset_vanilla") {
        static float grad[4];
        args.dsoftmax_offset = TensorView::contiguous(grad, DType::kFloat32, {4});
      }
      if (bad.name != "dropout_backward_without_rng") args.rng = RngState{};
      attention.backward(args);
    }
    FAIL() << "no error for " << bad.name;
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument) << error.what();
    EXPECT_EQ(error.argument(), bad.argument) << error.what();
    EXPECT_NE(std::string(error.what()).find(bad.argument), std::string::npos);
  }
  for (const HostTensor* out : {&o, &lse, &dq, &dk, &dv})
    for (int64_t i = 0; i < out->numel(); ++i)
      ASSERT_EQ(out->get(i), kSentinel) << bad.name << ": an output was written";
}

HostTensor int_tensor(std::vector<double> values) {
  return HostTensor::from_values(DType::kInt32, {int64_t(values.size())}, values);
}

INSTANTIATE_TEST_SUITE_P(
    BadInputs, Validation,
    ::testing::
        Values(
            BadInput{"negative_softcap", "softcap", [](CaseSpec& s) { s.config.softcap = -1; },
                     no_tensor_change},
            BadInput{"nan_softcap", "softcap", [](CaseSpec& s) { s.config.softcap = std::nan(""); },
                     no_tensor_change},
            BadInput{
                "infinite_softcap", "softcap",
                [](CaseSpec& s) { s.config.softcap = std::numeric_limits<double>::infinity(); },
                no_tensor_change},
            BadInput{"dropout_one", "dropout", [](CaseSpec& s) { s.config.dropout = 1.0; },
                     no_tensor_change},
            BadInput{"dropout_negative", "dropout", [](CaseSpec& s) { s.config.dropout = -0.1; },
                     no_tensor_change},
            BadInput{"per_call_dropout", "dropout", no_change, no_tensor_change},
            BadInput{"zero_scale", "scale", [](CaseSpec& s) { s.config.scale = 0.0; },
                     no_tensor_change},
            BadInput{"window_left_below_minus_one", "window_left",
                     [](CaseSpec& s) { s.config.window_left = -2; }, no_tensor_change},
            BadInput{"causal_with_right_window", "window_right",
                     [](CaseSpec& s) {
                       s.config.mask_type = MaskType::kCausal;
                       s.config.window_right = 3;
                     },
                     no_tensor_change},
            BadInput{"heads_not_divisible", "k", [](CaseSpec& s) { s.heads_kv = 3; },
                     no_tensor_change},
            BadInput{
                "k_head_dim_mismatch", "k", no_change,
                [](CaseSpec& s, CaseTensors& t) {
                  t.k = HostTensor(s.dtype, {s.batch, s.seqlen_kv, s.heads_kv, s.head_dim_qk + 1});
                }},
            BadInput{
                "v_length_mismatch", "v", no_change,
                [](CaseSpec& s, CaseTensors& t) {
                  t.v = HostTensor(s.dtype, {s.batch, s.seqlen_kv + 1, s.heads_kv, s.head_dim_v});
                }},
            BadInput{"k_dtype_mismatch", "k", no_change,
                     [](CaseSpec& s, CaseTensors& t) {
                       t.k = HostTensor(DType::kFloat32,
                                        {s.batch, s.seqlen_kv, s.heads_kv, s.head_dim_qk});
                     }},
            BadInput{"q_wrong_rank", "q", no_change,
                     [](CaseSpec& s, CaseTensors& t) {
                       t.q = HostTensor(s.dtype, {s.batch * s.seqlen_q, s.heads_q, s.head_dim_qk});
                     }},
            BadInput{"softmax_offset_wrong_shape", "softmax_offset",
                     [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; },
                     [](CaseSpec& s, CaseTensors& t) {
                       t.softmax_offset = HostTensor(DType::kFloat32, {s.heads_q + 1});
                     }},
            BadInput{"softmax_offset_wrong_dtype", "softmax_offset",
                     [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; },
                     [](CaseSpec& s, CaseTensors& t) {
                       t.softmax_offset = HostTensor(DType::kFloat64, {s.heads_q});
                     }},
            BadInput{"softmax_offset_missing", "softmax_offset",
                     [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; },
                     [](CaseSpec&, CaseTensors& t) { t.softmax_offset = HostTensor(); }},
            BadInput{"softmax_offset_nan", "softmax_offset",
                     [](CaseSpec& s) { s.config.softmax_type = SoftmaxType::kLearnable; },
                     [](CaseSpec&, CaseTensors& t) { t.softmax_offset.set(1, std::nan("")); }},
            BadInput{"softmax_offset_unused", "softmax_offset", no_change,
                     [](CaseSpec& s, CaseTensors& t) {
                       t.softmax_offset = HostTensor(DType::kFloat32, {s.heads_q});
                     }},
            BadInput{
                "bias_wrong_shape", "bias",
                [](CaseSpec& s) { s.config.bias_type = BiasType::kPostScale; },
                [](CaseSpec& s, CaseTensors& t) {
                  t.bias = HostTensor(s.dtype, {s.batch, s.heads_q, s.seqlen_q, s.seqlen_kv + 1});
                }},
            BadInput{"bias_without_bias_type", "bias", no_change,
                     [](CaseSpec& s, CaseTensors& t) {
                       t.bias = HostTensor(s.dtype, {1, 1, 1, s.seqlen_kv});
                     }},
            BadInput{"bias_type_without_bias", "bias",
                     [](CaseSpec& s) { s.config.bias_type = BiasType::kPreScale; },
                     [](CaseSpec&, CaseTensors& t) { t.bias = HostTensor(); }},
            BadInput{"alibi_wrong_shape", "alibi_slopes", [](CaseSpec& s) { s.alibi = true; },
                     [](CaseSpec& s, CaseTensors& t) {
                       t.alibi_slopes = HostTensor(DType::kFloat32, {s.heads_q - 1});
                     }},
            BadInput{"cu_seqlens_decreasing", "cu_seqlens_q", no_change,
                     [](CaseSpec&, CaseTensors& t) {
                       t.cu_seqlens_q = int_tensor({0, 4, 3});
                     }},
            BadInput{"cu_seqlens_too_long", "cu_seqlens_kv", no_change,
                     [](CaseSpec& s, CaseTensors& t) {
                       t.cu_seqlens_kv =
                           int_tensor({0, double(s.seqlen_kv + 1), double(s.seqlen_kv + 1)});
                     }},
            BadInput{"cu_seqlens_wrong_size", "cu_seqlens_q", no_change,
                     [](CaseSpec&, CaseTensors& t) {
                       t.cu_seqlens_q = int_tensor({0, 1, 2, 3});
                     }},
            BadInput{"thd_without_cu_seqlens", "cu_seqlens_q",
                     [](CaseSpec& s) {
                       s.config.format = Format::kTHD;
                       s.lengths_q = {2, 3};
                       s.lengths_kv = {3, 3};
                     },
                     [](CaseSpec&, CaseTensors& t) { t.cu_seqlens_q = HostTensor(); }},
            BadInput{"thd_cu_seqlens_beyond_rows", "q",
                     [](CaseSpec& s) {
                       s.config.format = Format::kTHD;
                       s.lengths_q = {2, 3};
                       s.lengths_kv = {3, 3};
                     },
                     [](CaseSpec&, CaseTensors& t) {
                       t.cu_seqlens_q = int_tensor({0, 2, 9});
                     }},
            BadInput{"padded_offsets_with_bshd", "cu_seqlens_q_padded", no_change,
                     [](CaseSpec&, CaseTensors& t) {
                       t.cu_seqlens_q_padded = int_tensor({0, 5, 10});
                     }},
            BadInput{"arbitrary_without_mask", "attn_mask",
                     [](CaseSpec& s) { s.config.mask_type = MaskType::kArbitrary; },
                     [](CaseSpec&, CaseTensors& t) { t.attn_mask = HostTensor(); }},
            BadInput{"null_q", "q", no_change,
                     [](CaseSpec&, CaseTensors& t) { t.q.view().data = nullptr; }},
            BadInput{"dropout_backward_without_rng", "rng",
                     [](CaseSpec& s) { s.config.dropout = 0.2; }, no_tensor_change, true},
            BadInput{"dbias_without_bias", "dbias", no_change, no_tensor_change, true},
            BadInput{"dsoftmax_offset_vanilla", "dsoftmax_offset", no_change, no_tensor_change,
                     true},
            // Enum values outside their name tables (e.g. from the C ABI or a cast).
            BadInput{"unknown_softmax_type", "softmax_type",
                     [](CaseSpec& s) { s.config.softmax_type = static_cast<SoftmaxType>(9); },
                     no_tensor_change},
            BadInput{"unknown_bias_type", "bias_type",
                     [](CaseSpec& s) { s.config.bias_type = static_cast<BiasType>(9); },
                     no_tensor_change},
            BadInput{
                "unknown_flash_forward_kernel", "flash_forward_kernel",
                [](CaseSpec&
                       s) { s.config.flash_forward_kernel = static_cast<FlashForwardKernel>(9); },
                no_tensor_change},
            // 2 was the plain wgmma form's value (removed): no longer a family.
            BadInput{
                "removed_flash_forward_kernel", "flash_forward_kernel",
                [](CaseSpec&
                       s) { s.config.flash_forward_kernel = static_cast<FlashForwardKernel>(2); },
                no_tensor_change},
            BadInput{
                "unknown_flash_backward_kernel", "flash_backward_kernel",
                [](CaseSpec&
                       s) { s.config.flash_backward_kernel = static_cast<FlashBackwardKernel>(9); },
                no_tensor_change, true}),
    [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

// Every named kernel family passes validation (the check reads the name tables, so a new
// family cannot be refused by a stale bound).
TEST(Validation, AcceptsEveryNamedKernelFamily) {
  CaseSpec spec;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  const CaseTensors t = make_case(spec);
  for (FlashForwardKernel forward :
       {FlashForwardKernel::kAuto, FlashForwardKernel::kMmaSync, FlashForwardKernel::kWgmmaWs})
    for (FlashBackwardKernel backward : {FlashBackwardKernel::kAuto, FlashBackwardKernel::kMmaSync,
                                         FlashBackwardKernel::kOneKernel}) {
      CaseSpec named = spec;
      named.config.flash_forward_kernel = forward;
      named.config.flash_backward_kernel = backward;
      EXPECT_NO_THROW(run_case(named, t, BackendKind::kCpuExact, true))
          << to_string(forward) << " / " << to_string(backward);
    }
}

}  // namespace
}  // namespace dpa::test
