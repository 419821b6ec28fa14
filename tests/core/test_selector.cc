// The fail-closed selector (DESIGN.md §6) on synthetic capability sets and on the real registry.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <ostream>
#include <string>

#include "core/environment.h"
#include "core/problem_builder.h"
#include "core/selector.h"
#include "support/attention_case.h"

namespace dpa {
namespace {

// A backend that honours everything; tests switch single capabilities off.
Capabilities everything(BackendKind kind) {
  Capabilities c;
  c.kind = kind;
  c.device = Device::kCPU;
  c.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  c.formats = {Format::kBSHD, Format::kSBHD, Format::kTHD};
  c.mask_types = {
      MaskType::kNoMask,        MaskType::kPadding,           MaskType::kCausal,
      MaskType::kPaddingCausal, MaskType::kCausalBottomRight, MaskType::kPaddingCausalBottomRight,
      MaskType::kArbitrary};
  c.window = c.padded_offsets = c.bias_grad = c.alibi = c.softcap = c.sink_grad = true;
  c.dropout = c.backward = c.deterministic = c.cp_tiles = true;
  c.bias_types = {BiasType::kNoBias, BiasType::kPreScale, BiasType::kPostScale};
  c.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable};
  return c;
}

struct CapabilityCase {
  const char* name;
  void (*remove)(Capabilities&);     // switch the capability off
  void (*request)(FeatureRequest&);  // ask for the feature
};

void PrintTo(const CapabilityCase& c, std::ostream* os) { *os << c.name; }

class SelectorCapability : public ::testing::TestWithParam<CapabilityCase> {};

// The fast backend lacks one feature: it must never be chosen when the feature is requested,
// and must stay the choice when it is not.
TEST_P(SelectorCapability, LackingBackendIsRejectedOnlyWhenFeatureRequested) {
  Capabilities fast = everything(BackendKind::kCudaFlash);
  Capabilities slow = everything(BackendKind::kCpuExact);
  GetParam().remove(fast);
  std::vector<const Capabilities*> candidates = {&fast, &slow};

  FeatureRequest plain;
  plain.device_arch = 90;
  Selection without = select_backend(plain, candidates, std::nullopt);
  ASSERT_TRUE(without.chosen.has_value());
  EXPECT_EQ(*without.chosen, BackendKind::kCudaFlash) << without.to_string();

  FeatureRequest with = plain;
  GetParam().request(with);
  Selection selection = select_backend(with, candidates, std::nullopt);
  ASSERT_TRUE(selection.chosen.has_value());
  EXPECT_EQ(*selection.chosen, BackendKind::kCpuExact) << selection.to_string();
  ASSERT_EQ(selection.verdicts.size(), 2u);
  EXPECT_FALSE(selection.verdicts[0].eligible);
  ASSERT_GE(selection.verdicts[0].reasons.size(), 1u) << selection.to_string();

  // Forcing the lacking backend fails with its reason instead of dropping the feature.
  Selection forced = select_backend(with, candidates, BackendKind::kCudaFlash);
  EXPECT_FALSE(forced.chosen.has_value());
  EXPECT_THROW(require_chosen(forced), Error);
}

INSTANTIATE_TEST_SUITE_P(
    Features, SelectorCapability,
    ::testing::Values(
        CapabilityCase{"softcap", [](Capabilities& c) { c.softcap = false; },
                       [](FeatureRequest& r) { r.softcap = true; }},
        CapabilityCase{"off_by_one_sink",
                       [](Capabilities& c) { c.softmax_types = {SoftmaxType::kVanilla}; },
                       [](FeatureRequest& r) { r.softmax_type = SoftmaxType::kOffByOne; }},
        CapabilityCase{"learnable_sink",
                       [](Capabilities& c) {
                         c.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne};
                       },
                       [](FeatureRequest& r) { r.softmax_type = SoftmaxType::kLearnable; }},
        CapabilityCase{"sink_grad", [](Capabilities& c) { c.sink_grad = false; },
                       [](FeatureRequest& r) {
                         r.softmax_type = SoftmaxType::kLearnable;
                         r.sink_grad = true;
                       }},
        CapabilityCase{"dropout", [](Capabilities& c) { c.dropout = false; },
                       [](FeatureRequest& r) { r.dropout = true; }},
        CapabilityCase{"bias_grad", [](Capabilities& c) { c.bias_grad = false; },
                       [](FeatureRequest& r) {
                         r.bias_type = BiasType::kPostScale;
                         r.bias_grad = true;
                       }},
        CapabilityCase{"pre_scale_bias",
                       [](Capabilities& c) {
                         c.bias_types = {BiasType::kNoBias, BiasType::kPostScale};
                       },
                       [](FeatureRequest& r) { r.bias_type = BiasType::kPreScale; }},
        CapabilityCase{"arbitrary_mask", [](Capabilities& c) { c.mask_types.pop_back(); },
                       [](FeatureRequest& r) { r.mask_type = MaskType::kArbitrary; }},
        CapabilityCase{"window", [](Capabilities& c) { c.window = false; },
                       [](FeatureRequest& r) { r.window = true; }},
        CapabilityCase{"alibi", [](Capabilities& c) { c.alibi = false; },
                       [](FeatureRequest& r) { r.alibi = true; }},
        CapabilityCase{"deterministic", [](Capabilities& c) { c.deterministic = false; },
                       [](FeatureRequest& r) { r.deterministic = true; }},
        CapabilityCase{"backward", [](Capabilities& c) { c.backward = false; },
                       [](FeatureRequest& r) { r.pass = Pass::kBackward; }},
        CapabilityCase{"cp_tiles", [](Capabilities& c) { c.cp_tiles = false; },
                       [](FeatureRequest& r) { r.cp.tile = true; }},
        CapabilityCase{"padded_offsets", [](Capabilities& c) { c.padded_offsets = false; },
                       [](FeatureRequest& r) {
                         r.format = Format::kTHD;
                         r.padded_offsets = true;
                       }},
        CapabilityCase{"head_dim",
                       [](Capabilities& c) {
                         c.head_dims_qk = c.head_dims_v = {64, 128};
                       },
                       [](FeatureRequest& r) { r.head_dim_qk = r.head_dim_v = 96; }},
        CapabilityCase{"mla_dims", [](Capabilities& c) { c.different_head_dims = false; },
                       [](FeatureRequest& r) { r.head_dim_v = 32; }},
        CapabilityCase{"dtype", [](Capabilities& c) { c.dtypes = {DType::kFloat32}; },
                       [](FeatureRequest& r) { r.dtype = DType::kFloat64; }},
        CapabilityCase{"memory",
                       [](Capabilities& c) {
                         c.size_limit = [](const FeatureRequest& r) -> std::optional<std::string> {
                           if (r.max_seqlen_q * r.max_seqlen_kv > 1000) return "too large";
                           return std::nullopt;
                         };
                       },
                       [](FeatureRequest& r) { r.max_seqlen_q = r.max_seqlen_kv = 100; }},
        CapabilityCase{"arch", [](Capabilities& c) { c.min_arch = 90; },
                       [](FeatureRequest& r) { r.device_arch = 80; }}),
    [](const ::testing::TestParamInfo<CapabilityCase>& info) { return info.param.name; });

TEST(Selector, NothingEligibleListsEveryBackendsReasons) {
  Capabilities a = everything(BackendKind::kCudaFlash);
  Capabilities b = everything(BackendKind::kCpu);
  a.softcap = false;
  b.softcap = false;
  b.dropout = false;
  FeatureRequest request;
  request.softcap = true;
  request.dropout = true;
  Selection selection = select_backend(request, {&a, &b}, std::nullopt);
  EXPECT_FALSE(selection.chosen);
  try {
    require_chosen(selection);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNotSupported);
    const std::string text = error.what();
    EXPECT_NE(text.find("cuda_flash"), std::string::npos) << text;
    EXPECT_NE(text.find("softcap not supported"), std::string::npos) << text;
    EXPECT_NE(text.find("dropout not supported"), std::string::npos) << text;
  }
}

TEST(Selector, UnavailableBackendIsRejectedWithItsReason) {
  Capabilities gpu = everything(BackendKind::kCudaFlash);
  gpu.available = false;
  gpu.unavailable_reason = "no CUDA device";
  Capabilities cpu = everything(BackendKind::kCpu);
  Selection selection = select_backend(FeatureRequest{}, {&gpu, &cpu}, std::nullopt);
  ASSERT_TRUE(selection.chosen);
  EXPECT_EQ(*selection.chosen, BackendKind::kCpu);
  EXPECT_EQ(selection.verdicts[0].reasons.at(0), "no CUDA device");
}

// A call stops at its backend: a later candidate's rules (cuda_unfused's asks the device for
// its free memory) are not run. Without a choice, every verdict is there for the error.
TEST(Selector, CallsStopAtTheChosenBackend) {
  Capabilities fast = everything(BackendKind::kCudaFlash);
  Capabilities later = everything(BackendKind::kCudaUnfused);
  int later_rules_run = 0;
  later.size_limit = [&](const FeatureRequest&) -> std::optional<std::string> {
    ++later_rules_run;
    return std::nullopt;
  };
  const std::vector<const Capabilities*> candidates = {&fast, &later};
  Selection call =
      select_backend(FeatureRequest{}, candidates, std::nullopt, Verdicts::kUntilChosen);
  ASSERT_TRUE(call.chosen);
  EXPECT_EQ(*call.chosen, BackendKind::kCudaFlash);
  EXPECT_EQ(call.verdicts.size(), 1u);
  EXPECT_EQ(later_rules_run, 0);

  Selection every = select_backend(FeatureRequest{}, candidates, std::nullopt);
  EXPECT_EQ(every.verdicts.size(), 2u);
  EXPECT_EQ(later_rules_run, 1);

  fast.softcap = false;
  later.softcap = false;
  FeatureRequest capped;
  capped.softcap = true;
  Selection none = select_backend(capped, candidates, std::nullopt, Verdicts::kUntilChosen);
  EXPECT_FALSE(none.chosen);
  ASSERT_EQ(none.verdicts.size(), 2u);
  EXPECT_EQ(none.verdicts[1].reasons.at(0), "softcap not supported");
}

// The message is composed only when the check fails.
TEST(Require, BuildsItsMessageOnlyOnFailure) {
  int built = 0;
  auto message = [&] {
    ++built;
    return std::string("has ") + std::to_string(3) + " rows";
  };
  EXPECT_NO_THROW(require(true, "q", message));
  EXPECT_EQ(built, 0);
  try {
    require(false, "q", message);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.argument(), "q");
    EXPECT_NE(std::string(error.what()).find("has 3 rows"), std::string::npos) << error.what();
  }
  EXPECT_EQ(built, 1);
}

TEST(Selector, DeviceMismatchRejects) {
  Capabilities gpu = everything(BackendKind::kCudaFlash);
  gpu.device = Device::kCUDA;
  FeatureRequest host;
  Selection selection = select_backend(host, {&gpu}, std::nullopt);
  EXPECT_FALSE(selection.chosen);
}

class EnvironmentVariable {
 public:
  EnvironmentVariable(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvironmentVariable() { unsetenv(name_); }

 private:
  const char* name_;
};

// The environment is read once, at construction (core/environment.h), through a getter.
EnvironmentGetter fake_environment(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    auto found = values.find(name);
    return found == values.end() ? nullptr : found->second.c_str();
  };
}

TEST(Selector, EnvironmentFillsOnlyWhatTheConfigLeavesAuto) {
  EXPECT_FALSE(forced_backend(BackendKind::kAuto).has_value());
  EXPECT_EQ(forced_backend(BackendKind::kCpu), BackendKind::kCpu);
  const EnvironmentGetter env = fake_environment({{"DPA_BACKEND", "cpu_exact"},
                                                  {"DPA_FLASH_FORWARD_KERNEL", "mma_sync"},
                                                  {"DPA_FLASH_BACKWARD_KERNEL", "mma_sync"}});
  AttentionConfig automatic;
  const AttentionConfig filled = config_with_environment(automatic, env);
  EXPECT_EQ(filled.backend, BackendKind::kCpuExact);
  EXPECT_EQ(filled.flash_forward_kernel, FlashForwardKernel::kMmaSync);
  EXPECT_EQ(filled.flash_backward_kernel, FlashBackwardKernel::kMmaSync);
  AttentionConfig explicit_config;
  explicit_config.backend = BackendKind::kCpu;
  explicit_config.flash_forward_kernel = FlashForwardKernel::kWgmmaWs;
  explicit_config.flash_backward_kernel = FlashBackwardKernel::kOneKernel;
  const AttentionConfig kept = config_with_environment(explicit_config, env);
  EXPECT_EQ(kept.backend, BackendKind::kCpu);
  EXPECT_EQ(kept.flash_forward_kernel, FlashForwardKernel::kWgmmaWs);
  EXPECT_EQ(kept.flash_backward_kernel, FlashBackwardKernel::kOneKernel);
  // Empty counts as unset.
  EXPECT_EQ(config_with_environment(automatic, fake_environment({{"DPA_BACKEND", ""}})).backend,
            BackendKind::kAuto);
}

TEST(Selector, UnknownEnvironmentNamesAreErrorsNamingTheVariable) {
  for (const char* name :
       {"DPA_BACKEND", "DPA_FLASH_FORWARD_KERNEL", "DPA_FLASH_BACKWARD_KERNEL"}) {
    try {
      config_with_environment(AttentionConfig{}, fake_environment({{name, "no_such_name"}}));
      ADD_FAILURE() << name << " accepted an unknown name";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(e.argument(), name);
    }
  }
  // The plain two-warpgroup wgmma form went in session 32: its name is refused, never taken as
  // another family.
  EXPECT_FALSE(parse_flash_forward_kernel("wgmma").has_value());
  EXPECT_EQ(parse_flash_forward_kernel("wgmma_ws"), FlashForwardKernel::kWgmmaWs);
}

// Plumbing: the forced choice reaches the run, from the config and from the environment.
TEST(Selector, ForcedBackendReachesTheRun) {
  test::CaseSpec spec;
  spec.config.softcap = 2.0;
  test::CaseTensors t = test::make_case(spec);
  test::CaseOutputs exact = test::run_case(spec, t, BackendKind::kCpuExact);
  EXPECT_EQ(exact.forward_backend, BackendKind::kCpuExact);
  EXPECT_EQ(exact.backward_backend, BackendKind::kCpuExact);
  test::CaseOutputs automatic = test::run_case(spec, t, BackendKind::kAuto);
  EXPECT_EQ(automatic.forward_backend, BackendKind::kCpu);
  EnvironmentVariable env("DPA_BACKEND", "cpu_exact");
  test::CaseOutputs from_env = test::run_case(spec, t, BackendKind::kAuto);
  EXPECT_EQ(from_env.forward_backend, BackendKind::kCpuExact);
  test::CaseOutputs explicit_wins = test::run_case(spec, t, BackendKind::kCpu);
  EXPECT_EQ(explicit_wins.forward_backend, BackendKind::kCpu);
}

TEST(Selector, ExplainListsEveryRegisteredBackend) {
  AttentionConfig config;
  config.softcap = 50;
  DotProductAttention attention(config);
  AttentionInputs in;
  int64_t q_shape[] = {2, 128, 8, 64}, kv_shape[] = {2, 128, 2, 64};
  in.q = TensorView::contiguous(nullptr, DType::kFloat32, q_shape, 4);
  in.k = TensorView::contiguous(nullptr, DType::kFloat32, kv_shape, 4);
  in.v = in.k;
  Selection selection = attention.explain(in, Pass::kBackward);
  ASSERT_TRUE(selection.chosen);
  EXPECT_EQ(*selection.chosen, BackendKind::kCpu);
  EXPECT_EQ(selection.verdicts.size(), registered_backends().size());
  const std::string text = selection.to_string();
  EXPECT_NE(text.find("cpu_exact"), std::string::npos);
}

// A host backend that describes its plan: explain() shows it, a call's selection never builds it.
class PlanningBackend : public Backend {
 public:
  explicit PlanningBackend(const Backend& real) : real_(real), caps_(real.capabilities()) {
    caps_.describe_plan = [this](const FeatureRequest&) {
      ++described_;
      return std::string("plan of the test");
    };
  }
  const Capabilities& capabilities() const override { return caps_; }
  void forward(const AttentionProblem& p) const override { real_.forward(p); }
  void backward(const AttentionProblem& p) const override { real_.backward(p); }
  int described() const { return described_; }

 private:
  const Backend& real_;
  Capabilities caps_;
  mutable int described_ = 0;
};

TEST(Selector, PlansAreDescribedForExplainOnly) {
  const Backend* cpu = nullptr;
  for (const Backend* backend : registered_backends())
    if (backend->capabilities().kind == BackendKind::kCpu) cpu = backend;
  ASSERT_NE(cpu, nullptr);
  const PlanningBackend planning(*cpu);
  const std::vector<const Backend*> backends = {&planning};
  test::CaseSpec spec;
  test::CaseTensors t = test::make_case(spec);
  ForwardArgs args;
  args.in = t.inputs();
  test::HostTensor o(spec.dtype, {spec.batch, spec.seqlen_q, spec.heads_q, spec.head_dim_v});
  test::HostTensor lse(DType::kFloat32, {spec.batch, spec.heads_q, spec.seqlen_q});
  args.o = o.view();
  args.lse = lse.view();
  const AttentionProblem problem = build_forward_problem(spec.config, args, 0.0, RngState{});
  const Backend& chosen = choose_backend(spec.config, problem, backends);
  EXPECT_EQ(&chosen, &planning);
  EXPECT_EQ(planning.described(), 0);  // nothing built on the call path
  const Selection explained =
      select_for_problem(spec.config, problem, backends, nullptr, /*with_plans=*/true);
  EXPECT_EQ(planning.described(), 1);
  ASSERT_EQ(explained.verdicts.size(), 1u);
  EXPECT_EQ(explained.verdicts[0].plan, "plan of the test");
  EXPECT_NE(explained.to_string().find("runs: plan of the test"), std::string::npos);
}

}  // namespace
}  // namespace dpa
