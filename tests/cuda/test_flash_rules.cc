// What cuda_flash's selection rules promise beyond the CP ones (test_cuda_cp_rules.cc): rows
// must be 16-byte aligned, and its one-kernel backward runs only when opted in until validated.
// Checked through the selector on the real capabilities; no GPU needed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "core/problem_builder.h"
#include "core/selector.h"
#include "cuda/flash/flash_tiles.h"
#include "dpa/attention.h"

namespace dpa {
namespace {

const Capabilities& flash_capabilities() {
  for (const Backend* backend : registered_backends())
    if (backend->capabilities().kind == BackendKind::kCudaFlash) return backend->capabilities();
  throw std::runtime_error("cuda_flash not registered");
}

bool refused_for(const FeatureRequest& request, const std::string& words) {
  const Selection selection =
      select_backend(request, {&flash_capabilities()}, BackendKind::kCudaFlash);
  for (const BackendVerdict& verdict : selection.verdicts)
    for (const std::string& reason : verdict.reasons)
      if (reason.find(words) != std::string::npos) return true;
  return false;
}

FeatureRequest gpu_request() {
  FeatureRequest r;
  r.device = Device::kCUDA;
  r.dtype = DType::kBFloat16;
  r.head_dim_qk = r.head_dim_v = 128;
  r.device_arch = 90;
  return r;
}

TEST(FlashRules, RefusesRowsThatAreNot16ByteAligned) {
  FeatureRequest r = gpu_request();
  EXPECT_FALSE(refused_for(r, "16-byte"));
  r.rows_16_byte_aligned = false;
  EXPECT_TRUE(refused_for(r, "16-byte"));
}

// The request's alignment fact comes from the problem: a q whose rows sit 2 bytes apart from
// 16-byte boundaries (a view one element into a buffer) is reported unaligned.
TEST(FlashRules, FeatureRequestSeesMisalignedRows) {
  std::vector<uint16_t> storage(2 * 4 * 2 * 64 + 8);
  auto view = [&](size_t first) {
    return TensorView::contiguous(storage.data() + first, DType::kBFloat16, {2, 4, 2, 64});
  };
  std::vector<float> lse(2 * 2 * 4);
  std::vector<uint16_t> o(2 * 4 * 2 * 64);
  ForwardArgs args;
  args.in.q = view(0);
  args.in.k = view(0);
  args.in.v = view(0);
  args.o = TensorView::contiguous(o.data(), DType::kBFloat16, {2, 4, 2, 64});
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {2, 2, 4});
  AttentionConfig config;
  const bool aligned = reinterpret_cast<uintptr_t>(storage.data()) % 16 == 0;
  if (aligned) {
    EXPECT_TRUE(
        make_feature_request(build_forward_problem(config, args, 0.0, {})).rows_16_byte_aligned);
  }
  args.in.q = view(1);
  EXPECT_FALSE(
      make_feature_request(build_forward_problem(config, args, 0.0, {})).rows_16_byte_aligned);
}

// The request says whether every sequence fills its tensor's rows (decode on the KV-cache
// kernel needs it: docs/cuda_flash.md), from the lengths cu_seqlens give with any mask.
TEST(FlashRules, FeatureRequestSeesWhetherSequencesFillTheirRows) {
  std::vector<uint16_t> q(2 * 2 * 4 * 64), kv(2 * 6 * 2 * 64), o(q.size());
  std::vector<float> lse(2 * 4 * 2);
  ForwardArgs args;
  args.in.q = TensorView::contiguous(q.data(), DType::kBFloat16, {2, 2, 4, 64});
  args.in.k = args.in.v = TensorView::contiguous(kv.data(), DType::kBFloat16, {2, 6, 2, 64});
  args.o = TensorView::contiguous(o.data(), DType::kBFloat16, {2, 2, 4, 64});
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {2, 4, 2});
  std::vector<int> cu_q, cu_kv;
  auto request = [&](MaskType mask, std::vector<int> q_starts, std::vector<int> kv_starts) {
    AttentionConfig config;
    config.mask_type = mask;
    cu_q = std::move(q_starts);
    cu_kv = std::move(kv_starts);
    args.in.cu_seqlens_q = TensorView::contiguous(cu_q.data(), DType::kInt32, {3});
    args.in.cu_seqlens_kv = TensorView::contiguous(cu_kv.data(), DType::kInt32, {3});
    return make_feature_request(build_forward_problem(config, args, 0.0, {}));
  };
  for (MaskType mask : {MaskType::kNoMask, MaskType::kPaddingCausalBottomRight}) {
    const FeatureRequest full = request(mask, {0, 2, 4}, {0, 6, 12});
    EXPECT_TRUE(full.queries_fill_rows && full.keys_fill_rows) << to_string(mask);
    const FeatureRequest short_keys = request(mask, {0, 2, 4}, {0, 6, 9});
    EXPECT_TRUE(short_keys.queries_fill_rows) << to_string(mask);
    EXPECT_FALSE(short_keys.keys_fill_rows) << to_string(mask);
    const FeatureRequest short_queries = request(mask, {0, 2, 3}, {0, 6, 12});
    EXPECT_FALSE(short_queries.queries_fill_rows) << to_string(mask);
    EXPECT_TRUE(short_queries.keys_fill_rows) << to_string(mask);
  }
}

// The request carries the most keys a query sees under a window bounded on both sides (the
// warp-specialised forward narrows its blocks under narrow windows at head dim 64), a causal
// mask's right bound counting as 0; explain() reports the tiles that follow from it.
TEST(FlashRules, FeatureRequestCarriesTheWindowSpanAndExplainTheTilesItGives) {
  std::vector<uint16_t> q(2 * 8 * 4 * 64), o(q.size());
  std::vector<float> lse(2 * 4 * 8);
  ForwardArgs args;
  args.in.q = args.in.k = args.in.v =
      TensorView::contiguous(q.data(), DType::kBFloat16, {2, 8, 4, 64});
  args.o = TensorView::contiguous(o.data(), DType::kBFloat16, {2, 8, 4, 64});
  args.lse = TensorView::contiguous(lse.data(), DType::kFloat32, {2, 4, 8});
  auto request = [&](MaskType mask, int64_t left, int64_t right) {
    AttentionConfig config;
    config.mask_type = mask;
    config.window_left = left;
    config.window_right = right;
    FeatureRequest r = make_feature_request(build_forward_problem(config, args, 0.0, {}));
    r.device = Device::kCUDA;  // the host tensors stand in for a device call's shapes
    r.device_arch = 90;
    r.max_seqlen_q = r.max_seqlen_kv = 8192;
    return r;
  };
  EXPECT_EQ(request(MaskType::kNoMask, -1, -1).window_span, -1);
  EXPECT_EQ(request(MaskType::kNoMask, 3, 5).window_span, 9);
  EXPECT_EQ(request(MaskType::kNoMask, -1, 5).window_span, -1);
  EXPECT_EQ(request(MaskType::kCausal, 127, -1).window_span, 128);
  EXPECT_EQ(request(MaskType::kCausal, -1, -1).window_span, -1);
  // Bounds up to INT64_MAX are valid: the span saturates instead of overflowing.
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(request(MaskType::kNoMask, kMax, kMax).window_span, kMax);
  EXPECT_EQ(request(MaskType::kCausal, kMax, -1).window_span, kMax);
  const Capabilities& caps = flash_capabilities();
  ASSERT_TRUE(bool(caps.describe_plan));
  EXPECT_NE(caps.describe_plan(request(MaskType::kCausal, 127, -1)).find("tiles 128 x 128"),
            std::string::npos);
  EXPECT_NE(caps.describe_plan(request(MaskType::kCausal, 1023, -1)).find("tiles 192 x 128"),
            std::string::npos);
  EXPECT_NE(caps.describe_plan(request(MaskType::kNoMask, -1, -1)).find("tiles 192 x 128"),
            std::string::npos);
  // The grid: blocks of work alike (no mask and no window, or both bounds) by a static stride;
  // causal or one bound by the dynamic scheduler (flash_forward_blocks_alike, as the plan).
  for (const auto& [mask, left, right, dynamic] :
       std::vector<std::tuple<MaskType, int64_t, int64_t, bool>>{
           {MaskType::kNoMask, -1, -1, false},
           {MaskType::kNoMask, 3, 5, false},
           {MaskType::kCausal, 127, -1, false},
           {MaskType::kCausal, -1, -1, true},
           {MaskType::kCausalBottomRight, -1, -1, true},
           {MaskType::kNoMask, 100, -1, true},
           {MaskType::kNoMask, -1, 100, true}}) {
    const std::string plan = caps.describe_plan(request(mask, left, right));
    EXPECT_NE(plan.find(dynamic ? "dynamic scheduler" : "static stride"), std::string::npos)
        << to_string(mask) << " " << left << " " << right << ": " << plan;
    EXPECT_EQ(plan.find(dynamic ? "static stride" : "dynamic scheduler"), std::string::npos);
  }
}

// A bf16 forward of 4096 queries on an H100/H200 at head dim `head_dim`.
FeatureRequest hopper_forward(int64_t head_dim) {
  FeatureRequest r;
  r.device = Device::kCUDA;
  r.dtype = DType::kBFloat16;
  r.device_arch = 90;
  r.head_dim_qk = r.head_dim_v = head_dim;
  r.max_seqlen_q = 4096;
  return r;
}

// explain() names the kernel family the launch would take, from the same shape functions, and
// the config's family reaches it (issue 17: the family is config, not a run-time variable).
TEST(FlashRules, PlanNamesTheKernelFamilyTheConfigAsksFor) {
  const Capabilities& caps = flash_capabilities();
  ASSERT_TRUE(bool(caps.describe_plan));
  FeatureRequest r = hopper_forward(128);
  EXPECT_NE(caps.describe_plan(r).find("warp-specialised"), std::string::npos);
  r.flash_forward_kernel = FlashForwardKernel::kWgmmaWs;
  EXPECT_NE(caps.describe_plan(r).find("warp-specialised"), std::string::npos);
  r.flash_forward_kernel = FlashForwardKernel::kMmaSync;
  EXPECT_NE(caps.describe_plan(r).find("mma_sync"), std::string::npos);
  // Every wgmma pair on the warp-specialised form, by default and pinned (the plain two-warpgroup
  // form went in session 32); 256 on 80-key tiles.
  const int pairs[][2] = {{64, 64}, {128, 128}, {192, 192}, {192, 128}, {256, 256}};
  for (const auto& pair : pairs)
    for (FlashForwardKernel kernel : {FlashForwardKernel::kAuto, FlashForwardKernel::kWgmmaWs}) {
      r.head_dim_qk = pair[0];
      r.head_dim_v = pair[1];
      r.flash_forward_kernel = kernel;
      EXPECT_NE(caps.describe_plan(r).find("warp-specialised"), std::string::npos)
          << pair[0] << "/" << pair[1] << " " << to_string(kernel);
    }
  r.flash_forward_kernel = FlashForwardKernel::kAuto;
  r.head_dim_qk = r.head_dim_v = 256;
  EXPECT_NE(caps.describe_plan(r).find("warp-specialised"), std::string::npos);
  EXPECT_NE(caps.describe_plan(r).find("tiles 128 x 80"), std::string::npos);
  // Dropout (keep bits drawn for a power-of-two tile) and windows keep 64-key tiles there.
  r.flash_forward_kernel = FlashForwardKernel::kAuto;
  r.dropout = true;
  EXPECT_NE(caps.describe_plan(r).find("warp-specialised"), std::string::npos);
  EXPECT_NE(caps.describe_plan(r).find("tiles 128 x 64"), std::string::npos);
  r.dropout = false;
  r.window_span = 4096;
  EXPECT_NE(caps.describe_plan(r).find("tiles 128 x 64"), std::string::npos);
  r.window_span = -1;
  // gpt-oss's local layers (d 64, GQA 64 / 8, a 128-key window): the query heads of a KV head
  // packed into 64-key-tile blocks; without GQA, one head per block on 128-key tiles.
  r.head_dim_qk = r.head_dim_v = 64;
  r.window_span = 128;
  r.heads_q = 64;
  r.heads_kv = 8;
  EXPECT_NE(caps.describe_plan(r).find("tiles 256 x 64"), std::string::npos);
  EXPECT_NE(caps.describe_plan(r).find("8 query heads per block (GQA packing"), std::string::npos);
  // Keys that end inside their tensor come partly by cp.async: no packing, 128-key tiles.
  r.keys_fill_rows = false;
  EXPECT_NE(caps.describe_plan(r).find("tiles 128 x 128"), std::string::npos);
  EXPECT_EQ(caps.describe_plan(r).find("GQA packing"), std::string::npos);
  r.keys_fill_rows = true;
  r.heads_kv = 64;
  EXPECT_NE(caps.describe_plan(r).find("tiles 128 x 128"), std::string::npos);
  EXPECT_EQ(caps.describe_plan(r).find("GQA packing"), std::string::npos);
  r.heads_q = r.heads_kv = 1;
  r.window_span = -1;
  r.head_dim_qk = r.head_dim_v = 128;
  r.device_arch = 80;
  r.flash_forward_kernel = FlashForwardKernel::kAuto;
  EXPECT_NE(caps.describe_plan(r).find("mma_sync"), std::string::npos);
  r.pass = Pass::kBackward;
  r.device_arch = 90;
  EXPECT_NE(caps.describe_plan(r).find("family one_kernel"), std::string::npos);
  EXPECT_EQ(caps.describe_plan(r).find("key-block order"), std::string::npos);
  r.deterministic = true;  // the one-kernel family orders its reductions
  EXPECT_NE(caps.describe_plan(r).find("family one_kernel"), std::string::npos);
  EXPECT_NE(caps.describe_plan(r).find("in key-block order"), std::string::npos);
  r.deterministic = false;
  EXPECT_NE(caps.describe_plan(r).find(", 64-row query tiles"), std::string::npos);
  // Head dim 64 takes 128-row query tiles, and 64 under a narrow window.
  r.head_dim_qk = r.head_dim_v = 64;
  EXPECT_NE(caps.describe_plan(r).find(", 128-row query tiles"), std::string::npos);
  r.window_span = 128;
  EXPECT_NE(caps.describe_plan(r).find(", 64-row query tiles"), std::string::npos);
  r.window_span = -1;
  r.head_dim_qk = r.head_dim_v = 128;
  r.flash_backward_kernel = FlashBackwardKernel::kMmaSync;
  EXPECT_NE(caps.describe_plan(r).find("mma_sync"), std::string::npos);
}

// The warp-specialised forward's kernel per logit form (flash_forward_logit_form), as explain()
// names it: plain logits at d64, the fixed-max softcap in bf16 at d64 and d128 (caps up to
// 50.25, no ALiBi), the general kernel for everything else.
TEST(FlashRules, PlanNamesTheLogitFormKernelThatRuns) {
  const Capabilities& caps = flash_capabilities();
  ASSERT_TRUE(bool(caps.describe_plan));
  FeatureRequest r = hopper_forward(64);
  r.mask_type = MaskType::kCausal;
  r.softmax_type = SoftmaxType::kLearnable;  // a sink changes no form
  const std::string plain = "plain-logits kernel", softcap = "fixed-max softcap kernel";
  auto names = [&](const FeatureRequest& request, const std::string& form) {
    return caps.describe_plan(request).find(form) != std::string::npos;
  };
  EXPECT_TRUE(names(r, plain));
  for (bool FeatureRequest::*feature :
       {&FeatureRequest::softcap, &FeatureRequest::alibi, &FeatureRequest::dropout}) {
    FeatureRequest with = r;
    with.*feature = true;
    EXPECT_FALSE(names(with, plain));
  }
  FeatureRequest capped = r;
  capped.softcap = true;
  capped.softcap_value = 50.0;
  EXPECT_TRUE(names(capped, softcap));
  capped.head_dim_qk = capped.head_dim_v = 128;
  EXPECT_TRUE(names(capped, softcap));
  FeatureRequest online = capped;
  online.softcap_value = 60.0;  // above 50.25: the max stays online
  EXPECT_FALSE(names(online, softcap));
  online = capped;
  online.dtype = DType::kFloat16;  // fp16 P would overflow under the fixed max
  EXPECT_FALSE(names(online, softcap));
  online = capped;
  online.dropout = true;
  EXPECT_FALSE(names(online, softcap));
  capped.head_dim_qk = capped.head_dim_v = 256;  // its ws form by default, since session 27
  EXPECT_TRUE(names(capped, softcap));
  r.head_dim_qk = r.head_dim_v = 128;
  EXPECT_TRUE(names(r, "warp-specialised"));
  EXPECT_FALSE(names(r, plain));
  using cuda::FlashLogitForm;
  EXPECT_EQ(cuda::flash_forward_logit_form(128, 128, false, false, false, false),
            FlashLogitForm::kGeneral);
  EXPECT_EQ(cuda::flash_forward_logit_form(64, 64, false, false, false, false),
            FlashLogitForm::kPlain);
  EXPECT_EQ(cuda::flash_forward_logit_form(64, 64, true, true, false, false),
            FlashLogitForm::kSoftcapFixedMax);
  EXPECT_EQ(cuda::flash_forward_logit_form(256, 256, true, true, false, false),
            FlashLogitForm::kSoftcapFixedMax);
  EXPECT_EQ(cuda::flash_forward_logit_form(192, 192, true, true, false, false),
            FlashLogitForm::kGeneral);
  EXPECT_EQ(cuda::flash_forward_logit_form(64, 64, false, false, true, false),
            FlashLogitForm::kGeneral);
}

}  // namespace
}  // namespace dpa
