// cuda_flash forward and backward against cpu_exact on every configuration it takes
// (gpu_cases.cc), and what its selection rules promise: the backward only when opted in (until
// its first GPU validation), no arbitrary mask or bias, chosen for decode shapes, deterministic
// results.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <utility>

#include "core/workspace.h"
#include "gpu/device_case.h"
#include "gpu/gpu_cases.h"

namespace dpa::test {
namespace {

void skip_without_gpu() {
  std::string why;
  if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
}

class FlashForward : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(FlashForward, MatchesExact) {
  check_case_on_backend(GetParam(), BackendKind::kCudaFlash, /*backward=*/false);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashForward, ::testing::ValuesIn(flash_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return info.param.name;
                         });

// Forward and backward on cuda_flash: o, LSE, dq, dk, dv and dalpha against cpu_exact.
class FlashForwardBackward : public ::testing::TestWithParam<GpuCase> {
 protected:
  void SetUp() override { skip_without_gpu(); }
};

TEST_P(FlashForwardBackward, MatchesExact) {
  check_case_on_backend(GetParam(), BackendKind::kCudaFlash, /*backward=*/true);
}

INSTANTIATE_TEST_SUITE_P(Cases, FlashForwardBackward, ::testing::ValuesIn(flash_cases()),
                         [](const ::testing::TestParamInfo<GpuCase>& info) {
                           return info.param.name;
                         });

// Shapes only (null data on the device): what explain() sees.
AttentionInputs device_shapes(int64_t b, int64_t sq, int64_t skv, int64_t heads_q, int64_t heads_kv,
                              int64_t d) {
  AttentionInputs in;
  in.q = TensorView::contiguous(nullptr, DType::kBFloat16, {b, sq, heads_q, d}, Device::kCUDA);
  in.k = TensorView::contiguous(nullptr, DType::kBFloat16, {b, skv, heads_kv, d}, Device::kCUDA);
  in.v = in.k;
  return in;
}

const BackendVerdict* verdict_for(const Selection& selection, BackendKind backend) {
  for (const BackendVerdict& verdict : selection.verdicts)
    if (verdict.backend == backend) return &verdict;
  return nullptr;
}

TEST(FlashSelection, RefusesArbitraryMaskWithAReason) {
  AttentionConfig config;
  config.mask_type = MaskType::kArbitrary;
  DotProductAttention attention(config);
  AttentionInputs in = device_shapes(2, 128, 128, 8, 2, 128);
  in.attn_mask = TensorView::contiguous(nullptr, DType::kBool, {1, 1, 128, 128}, Device::kCUDA);
  const Selection selection = attention.explain(in, Pass::kForward);
  const BackendVerdict* flash = verdict_for(selection, BackendKind::kCudaFlash);
  ASSERT_NE(flash, nullptr) << selection.to_string();
  EXPECT_FALSE(flash->eligible);
  EXPECT_FALSE(flash->reasons.empty());
  EXPECT_NE(selection.chosen, BackendKind::kCudaFlash);
}

class FlashOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
  }
};

// The selector prefers cuda_flash for GPU tensors wherever it is eligible, decode included.
TEST_F(FlashOnGpu, ChosenAutomaticallyForDecode) {
  DotProductAttention attention(AttentionConfig{});
  const Selection selection =
      attention.explain(device_shapes(2, 1, 32768, 64, 8, 128), Pass::kForward);
  EXPECT_EQ(selection.chosen, BackendKind::kCudaFlash) << selection.to_string();
}

// explain() names the KV-cache kernel for a decode it can run (GQA packing), and the flash
// forward's decode tiles for a top-left causal decode, whose diagonal that kernel cannot place
// (docs/cuda_flash.md, "Decode on the KV-cache kernel").
TEST_F(FlashOnGpu, ExplainNamesTheKvCacheKernelForDecode) {
  const auto plan = [](MaskType mask) {
    AttentionConfig config;
    config.mask_type = mask;
    const Selection selection =
        DotProductAttention(config).explain(device_shapes(2, 1, 32768, 64, 8, 128), Pass::kForward);
    const BackendVerdict* flash = verdict_for(selection, BackendKind::kCudaFlash);
    EXPECT_TRUE(flash != nullptr && flash->eligible) << selection.to_string();
    return flash != nullptr ? flash->plan : std::string();
  };
  EXPECT_NE(plan(MaskType::kCausalBottomRight).find("kvcache decode"), std::string::npos);
  EXPECT_NE(plan(MaskType::kNoMask).find("kvcache decode"), std::string::npos);
  EXPECT_NE(plan(MaskType::kCausal).find("mma_sync decode"), std::string::npos);
}

// A decode with no keys at all (skv = 0) runs on the KV-cache kernel's route: o = 0 and the
// LSE is each head's sink logit (DESIGN.md §3), as cpu_exact gives. Outside the case suites,
// whose comparison refuses a zero reference o.
class FlashDecodeWithoutKeys : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  }
};

TEST_F(FlashDecodeWithoutKeys, GivesZeroAndTheSinkLse) {
  CaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.batch = 2;
  spec.seqlen_q = 3;
  spec.seqlen_kv = 0;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.config.softmax_type = SoftmaxType::kLearnable;
  spec.seed = 77;
  const CaseTensors tensors = make_case(spec);
  const auto expect_contract = [&](const CaseOutputs& out, const char* who) {
    for (int64_t n = 0; n < out.o.numel(); ++n)
      ASSERT_EQ(out.o.get(n), 0.0) << who << ": o[" << n << "]";
    ASSERT_EQ(out.lse.numel(), spec.batch * spec.heads_q * spec.seqlen_q) << who;
    for (int64_t n = 0; n < out.lse.numel(); ++n) {
      const int64_t head = (n / spec.seqlen_q) % spec.heads_q;  // lse is [b, H, sq]
      EXPECT_NEAR(out.lse.get(n), tensors.softmax_offset.get(head), 1e-6)
          << who << ": lse[" << n << "]";
    }
  };
  expect_contract(run_case(spec, tensors, BackendKind::kCpuExact, /*backward=*/false), "cpu_exact");
  // The sink is what gives the LSE its value: without it an empty row's LSE is -inf.
  CaseSpec vanilla = spec;
  vanilla.config.softmax_type = SoftmaxType::kVanilla;
  CaseTensors no_offsets = tensors;
  no_offsets.softmax_offset = HostTensor();
  const CaseOutputs without_sink = run_case(vanilla, no_offsets, BackendKind::kCpuExact, false);
  ASSERT_GT(without_sink.lse.numel(), 0);
  EXPECT_EQ(without_sink.lse.get(0), -std::numeric_limits<double>::infinity());
  if (reference_only_mode()) GTEST_SKIP() << "reference only";
  const CaseOutputs got =
      run_device_case(spec, tensors, BackendKind::kCudaFlash, /*backward=*/false);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  expect_contract(got, "cuda_flash");
}

// A backward without queries (sq = 0) at head dim 64, whose one-kernel form takes dq tickets
// (flash_backward_dq_takes_tickets) for query tiles it then has none of: no error, and dk and
// dv are zero, as cpu_exact gives.
using FlashBackwardWithoutQueries = FlashDecodeWithoutKeys;
TEST_F(FlashBackwardWithoutQueries, GivesZeroKeyGradients) {
  CaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.batch = 2;
  spec.seqlen_q = 0;
  spec.seqlen_kv = 300;
  spec.heads_q = 8;
  spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 64;
  spec.seed = 78;
  const CaseTensors tensors = make_case(spec);
  const auto expect_zero_key_gradients = [&](const CaseOutputs& out, const char* who) {
    ASSERT_EQ(out.dk.numel(), spec.batch * spec.seqlen_kv * spec.heads_kv * 64) << who;
    ASSERT_EQ(out.dv.numel(), out.dk.numel()) << who;
    for (int64_t n = 0; n < out.dk.numel(); ++n) {
      ASSERT_EQ(out.dk.get(n), 0.0) << who << ": dk[" << n << "]";
      ASSERT_EQ(out.dv.get(n), 0.0) << who << ": dv[" << n << "]";
    }
  };
  expect_zero_key_gradients(run_case(spec, tensors, BackendKind::kCpuExact), "cpu_exact");
  if (reference_only_mode()) GTEST_SKIP() << "reference only";
  const CaseOutputs got = run_device_case(spec, tensors, BackendKind::kCudaFlash, true);
  EXPECT_EQ(got.backward_backend, BackendKind::kCudaFlash);
  expect_zero_key_gradients(got, "cuda_flash");
}

GpuCase find_case(const std::string& name) {
  for (const GpuCase& c : gpu_cases())
    if (c.name == name) return c;
  ADD_FAILURE() << "no case " << name;
  return {};
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.view().data, b.view().data, size_t(a.numel()) * dtype_size(a.dtype())) == 0;
}

// The split-KV merge runs in a fixed order and nothing uses atomics: two runs agree to the bit
// (cuda_flash declares itself deterministic).
TEST_F(FlashOnGpu, DecodeIsBitwiseDeterministic) {
  const GpuCase c = find_case("decode_gqa_64_8_sink");
  const CaseSpec spec = gpu_case_spec(c);
  const CaseTensors& tensors = gpu_case_tensors(c);
  const CaseOutputs first = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  const CaseOutputs second = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  EXPECT_TRUE(same_bytes(first.o, second.o));
  EXPECT_TRUE(same_bytes(first.lse, second.lse));
}

// Deterministic mode orders the one-kernel backward's dq reductions by key block (GQA groups
// and the sink gradient are summed in a fixed order anyway): two runs agree to the bit in every
// gradient.
TEST_F(FlashOnGpu, DeterministicBackwardIsBitwiseRepeatable) {
  const GpuCase c = find_case("sink_learnable_softcap_causal");
  CaseSpec spec = gpu_case_spec(c);
  spec.config.deterministic = true;
  const CaseTensors& tensors = gpu_case_tensors(c);
  const CaseOutputs first = run_device_case(spec, tensors, BackendKind::kCudaFlash, true);
  const CaseOutputs second = run_device_case(spec, tensors, BackendKind::kCudaFlash, true);
  EXPECT_EQ(first.backward_backend, BackendKind::kCudaFlash);
  EXPECT_TRUE(same_bytes(first.dq, second.dq));
  EXPECT_TRUE(same_bytes(first.dk, second.dk));
  EXPECT_TRUE(same_bytes(first.dv, second.dv));
  EXPECT_TRUE(same_bytes(first.dsoftmax_offset, second.dsoftmax_offset));
}

// Many key blocks add to each dq tile (2200 keys: 18 blocks of 128 in the narrow form, 35 of 64
// in the wide one at head dims 192 / 128 and 256, past one chain of kDeterministicKeyChain = 16),
// a GQA group and a window that starts the tiles' contributors at different blocks:
// deterministic runs agree to the bit and match cpu_exact, with dropout too at 192 (the wide
// form's dropout instantiation, whose producer draws keep bits beside the hand-off; at 0.2 its
// dq moves 0.45 from the run without, 15x the tolerance, where 0.1 gave 0.31). The default
// runs' reductions land in any order; whether two of them differed is logged, not asserted (they
// may agree by chance).
TEST_F(FlashOnGpu, DeterministicOrderHoldsAcrossKeyBlockChains) {
  struct Dims {
    int dqk, dv;
    double dropout;
  };
  for (const auto& [dqk, dv, dropout] :
       {Dims{128, 128, 0.0}, {192, 128, 0.0}, {256, 256, 0.0}, {192, 192, 0.2}}) {
    CaseSpec spec = gpu_case_spec(find_case("gqa_8_2"));
    spec.config.dropout = dropout;
    spec.config.seed = 11;
    spec.batch = 2;
    spec.seqlen_q = 260;
    spec.seqlen_kv = 2200;
    spec.heads_q = 4;
    spec.heads_kv = 2;
    spec.head_dim_qk = dqk;
    spec.head_dim_v = dv;
    spec.config.window_left = 1500;
    spec.config.window_right = 300;
    const std::string dims =
        std::to_string(dqk) + "x" + std::to_string(dv) + (dropout > 0 ? "_dropout" : "");
    const CaseTensors tensors = make_case(spec);
    CaseSpec deterministic = spec;
    deterministic.config.deterministic = true;
    const std::string key = "deterministic_chains_" + dims;  // named: -Wdangling-reference
    const CaseOutputs& reference = exact_reference(key, deterministic, tensors, true);
    if (dropout > 0) {  // the premise: dropout moves the truth by far more than the tolerance
      CaseSpec kept = deterministic;
      kept.config.dropout = 0.0;
      const CaseOutputs without = run_case(kept, tensors, BackendKind::kCpuExact, true);
      ASSERT_GT(relative_error(without.dq, reference.dq), 10 * gradient_tolerance(spec.dtype))
          << dims;
    }
    const CaseOutputs first =
        run_device_case(deterministic, tensors, BackendKind::kCudaFlash, true);
    expect_matches_reference(first, reference, spec.dtype, true, "deterministic " + dims);
    for (int run = 0; run < 3; ++run) {
      const CaseOutputs again =
          run_device_case(deterministic, tensors, BackendKind::kCudaFlash, true);
      EXPECT_TRUE(same_bytes(first.dq, again.dq)) << dims << ", run " << run;
      EXPECT_TRUE(same_bytes(first.dk, again.dk)) << dims << ", run " << run;
      EXPECT_TRUE(same_bytes(first.dv, again.dv)) << dims << ", run " << run;
    }
    const CaseOutputs a = run_device_case(spec, tensors, BackendKind::kCudaFlash, true);
    const CaseOutputs b = run_device_case(spec, tensors, BackendKind::kCudaFlash, true);
    std::printf("[ note     ] %s: two default (unordered) backward runs: dq %s\n", dims.c_str(),
                same_bytes(a.dq, b.dq) ? "agreed" : "differed");
  }
}

// Softcap with a fixed max (bf16, cap 50: softcap_fixed_max_applies) at the edge of its
// range: q ~ +3 and k ~ -3 put every raw logit near -1150, so every capped logit sits at -50
// (log2 units -72.1) and P = exp2(s - m) at 2^-80, the floor of the fixed shift's range. Had
// the bound been wrong, every P (or P V) would flush to zero and each row would read as empty
// (o = 0, lse = -inf). The cap moves the truth by far more than the tolerance (without it each row
// is one-hot on its largest logit; with it nearly uniform).
TEST(FlashSoftcapFixedMax, KeepsRowsWhoseLogitsAllSitAtMinusTheCap) {
  std::string why;  // GTEST_SKIP must run in the test body itself to end it
  if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  CaseSpec spec;
  spec.dtype = DType::kBFloat16;
  spec.batch = 2;
  spec.seqlen_q = 130;
  spec.seqlen_kv = 300;
  spec.heads_q = 4;
  spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = 128;
  spec.qk_stddev = 0.3;
  spec.config.scale = 1.0;
  spec.config.softcap = 50.0;
  CaseTensors tensors = make_case(spec);
  for (int64_t i = 0; i < tensors.q.numel(); ++i) tensors.q.set(i, tensors.q.get(i) + 3.0);
  for (int64_t i = 0; i < tensors.k.numel(); ++i) tensors.k.set(i, tensors.k.get(i) - 3.0);
  CaseSpec uncapped = spec;
  uncapped.config.softcap = 0.0;
  const CaseOutputs with_cap = run_case(spec, tensors, BackendKind::kCpuExact, false);
  const CaseOutputs without = run_case(uncapped, tensors, BackendKind::kCpuExact, false);
  ASSERT_GT(relative_error(without.o, with_cap.o), 10 * output_tolerance(spec.dtype));
  if (reference_only_mode()) GTEST_SKIP() << "reference only";
  const CaseOutputs got = run_device_case(spec, tensors, BackendKind::kCudaFlash, false);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  expect_matches_reference(got, with_cap, spec.dtype, false, "softcap 50 at -cap");
}

// Automatic selection runs the whole step on cuda_flash, and its gradients (the one-kernel
// backward's, on Hopper) match cpu_exact.
TEST_F(FlashOnGpu, AutoSelectionRunsFlashForwardAndBackward) {
  const GpuCase c = find_case("sink_learnable_softcap_causal");
  const CaseSpec spec = gpu_case_spec(c);
  const CaseTensors& tensors = gpu_case_tensors(c);
  const CaseOutputs& reference = exact_reference(c.name, spec, tensors, true);
  const CaseOutputs got = run_device_case(spec, tensors, BackendKind::kAuto, true);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  EXPECT_EQ(got.backward_backend, BackendKind::kCudaFlash);
  expect_matches_reference(got, reference, spec.dtype, true, "auto selection");
}

// o, the LSE and the gradients of two runs, byte for byte.
void expect_same_outputs(const CaseOutputs& a, const CaseOutputs& b, const std::string& what) {
  EXPECT_TRUE(same_bytes(a.o, b.o)) << what;
  EXPECT_TRUE(same_bytes(a.lse, b.lse)) << what;
  EXPECT_TRUE(same_bytes(a.dq, b.dq)) << what;
  EXPECT_TRUE(same_bytes(a.dk, b.dk)) << what;
  EXPECT_TRUE(same_bytes(a.dv, b.dv)) << what;
}

// A caller's workspace (exactly workspace_size() bytes, poisoned) gives the same bits as the
// driver's pool, and no call wants more than it was given: every buffer is counted and every
// buffer read is written first.
TEST_F(FlashOnGpu, CallerWorkspaceGivesTheSameBits) {
  const uint64_t shortfall_before = workspace_shortfall_bytes();
  for (const char* name : {"decode_gqa_64_8_sink", "sink_learnable_softcap_causal",
                           "thd_padded_offsets_causal", "dropout_causal_sink_softcap"}) {
    const GpuCase c = find_case(name);
    CaseSpec spec = gpu_case_spec(c);
    spec.config.deterministic = true;  // bitwise comparable backward
    const CaseTensors& tensors = gpu_case_tensors(c);
    for (BackendKind backend : {BackendKind::kCudaFlash, BackendKind::kCudaUnfused}) {
      const CaseOutputs pool = run_device_case(spec, tensors, backend, true);
      const CaseOutputs given =
          run_device_case(spec, tensors, backend, true, {.caller_workspace = true});
      const std::string what = std::string(name) + " on " + std::string(to_string(backend));
      expect_same_outputs(pool, given, what);
    }
  }
  EXPECT_EQ(workspace_shortfall_bytes(), shortfall_before);
}

// A call captured into a CUDA graph (the global mode, torch.cuda.graph's default) and run as
// one launch of it gives the bits of the same call made eagerly: no step of it needs the host
// between its kernels, its own buffers come from graph allocations or the caller's workspace,
// and its uploaded tables travel in the graph (cuda/host_upload.h), not at a host address
// that the call releases.
TEST_F(FlashOnGpu, CapturedCallsGiveTheSameBits) {
  for (const char* name :
       {"decode_gqa_64_8_sink", "sink_learnable_softcap_causal", "dropout_causal_sink_softcap"}) {
    const GpuCase c = find_case(name);
    CaseSpec spec = gpu_case_spec(c);
    spec.config.deterministic = true;  // bitwise comparable backward
    const CaseTensors& tensors = gpu_case_tensors(c);
    for (BackendKind backend : {BackendKind::kCudaFlash, BackendKind::kCudaUnfused}) {
      const CaseOutputs eager = run_device_case(spec, tensors, backend, true);
      for (const bool caller_workspace : {false, true}) {
        const CaseOutputs captured = run_device_case(
            spec, tensors, backend, true, {.caller_workspace = caller_workspace, .captured = true});
        const std::string what = std::string(name) + " on " + std::string(to_string(backend)) +
                                 (caller_workspace ? ", caller's workspace" : ", pool");
        expect_same_outputs(eager, captured, what);
      }
    }
  }
}

// Device-resident sequence boundaries are read on the host before the kernels are chosen; a
// graph could not replay that read, so a capturing stream is refused by name.
TEST_F(FlashOnGpu, CapturingACallThatReadsDeviceTablesIsRefusedNamingTheStream) {
  const GpuCase c = find_case("thd_padded_offsets_causal");
  const CaseSpec spec = gpu_case_spec(c);
  try {
    run_device_case(spec, gpu_case_tensors(c), BackendKind::kCudaFlash, false, {.captured = true});
    ADD_FAILURE() << "the captured call ran; expected an error naming the stream";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kNotSupported) << error.what();
    EXPECT_EQ(error.argument(), "stream") << error.what();
  }
  // The refusal left the stream usable: the same call runs eagerly.
  expect_matches_reference(
      run_device_case(spec, gpu_case_tensors(c), BackendKind::kCudaFlash, false),
      exact_reference(c.name, spec, gpu_case_tensors(c), false), spec.dtype, false,
      "eager after the refused capture");
}

}  // namespace
}  // namespace dpa::test
