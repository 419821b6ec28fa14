// A NaN in a key that some rows of its sequence do not see (past the causal diagonal, outside a
// window) reaches only the rows that see it (the non-finite contract, docs/decisions.md). The
// key sits in a tile the mask crosses, beside keys the same rows do see, so every form of the
// cap's arithmetic there (a reciprocal per element, or one shared by four elements of a row as
// in fully visible tiles) must keep the NaN out of its neighbours. Forward only: the rows that
// see the NaN reach most keys' dk and dv.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "gpu/device_case.h"

namespace dpa::test {
namespace {

// Of 256 keys: inside the first key tile, beside keys that rows before it (causal) and rows
// more than 64 after it (the window) see.
constexpr int64_t kNanKey = 100;

struct InvisibleKeyCase {
  std::string name;
  DType dtype;
  int64_t head_dim;
  bool window;     // (64, 0) instead of plain causal: rows past the key's window lose it too
  double softcap;  // 0: none; else with scale 1, so that the cap bends every logit
};

CaseSpec invisible_key_spec(const InvisibleKeyCase& c) {
  CaseSpec spec;
  spec.dtype = c.dtype;
  spec.batch = 1;
  spec.seqlen_q = spec.seqlen_kv = 256;
  spec.heads_q = spec.heads_kv = 2;
  spec.head_dim_qk = spec.head_dim_v = c.head_dim;
  spec.config.mask_type = MaskType::kCausal;
  if (c.window) spec.config.window_left = 64;
  if (c.softcap > 0) {
    spec.config.softcap = c.softcap;
    spec.config.scale = 1.0;
  }
  return spec;
}

// Where the reference is NaN the result must be NaN too; both become 0 there, so that the rest
// compares as usual. Returns how many such elements the reference has.
int64_t match_and_clear_nan(HostTensor& got, HostTensor& reference, const char* what) {
  int64_t nans = 0;
  for (int64_t n = 0; n < reference.numel(); ++n) {
    if (!std::isnan(reference.get(n))) continue;
    ++nans;
    EXPECT_TRUE(std::isnan(got.get(n))) << what << " element " << n << " must be NaN";
    reference.set(n, 0.0);
    got.set(n, 0.0);
  }
  return nans;
}

class FlashInvisibleKeys : public ::testing::TestWithParam<InvisibleKeyCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why) && !reference_only_mode()) GTEST_SKIP() << why;
  }
};

TEST_P(FlashInvisibleKeys, NanThereReachesOnlyTheRowsThatSeeIt) {
  const InvisibleKeyCase& c = GetParam();
  const CaseSpec spec = invisible_key_spec(c);
  CaseTensors tensors = make_case(spec);
  if (c.softcap > 0) {
    ASSERT_GT(softcap_moves_o(spec, tensors), 10.0 * output_tolerance(spec.dtype))
        << "the cap must move the reference";
  }
  // k[0, kNanKey, head 1, 0]: head 1's rows that see the key turn NaN, the others must not.
  tensors.k.set((kNanKey * 2 + 1) * c.head_dim, std::numeric_limits<double>::quiet_NaN());
  CaseOutputs reference = run_case(spec, tensors, BackendKind::kCpuExact, /*backward=*/false);
  // lse [1, 2, 256]: the NaN rows are head 1's from the key on (under the window, only up to 64
  // rows after it); the test fails if a kernel lets the NaN reach any other row.
  const int64_t last_nan_row = c.window ? kNanKey + 64 : 255;
  for (int64_t i = 0; i < 256; ++i) {
    const bool sees_the_key = i >= kNanKey && i <= last_nan_row;
    ASSERT_EQ(std::isnan(reference.lse.get(256 + i)), sees_the_key) << "reference row " << i;
    ASSERT_FALSE(std::isnan(reference.lse.get(i))) << "reference head 0 row " << i;
  }
  if (reference_only_mode()) GTEST_SKIP() << "reference only";

  CaseOutputs got = run_device_case(spec, tensors, BackendKind::kCudaFlash, /*backward=*/false);
  EXPECT_EQ(got.forward_backend, BackendKind::kCudaFlash);
  EXPECT_EQ(match_and_clear_nan(got.lse, reference.lse, "lse"), last_nan_row - kNanKey + 1);
  EXPECT_GT(match_and_clear_nan(got.o, reference.o, "o"), 0);
  expect_matches_reference(got, reference, spec.dtype, /*backward=*/false,
                           c.name + " with a NaN key");
}

INSTANTIATE_TEST_SUITE_P(
    Cases, FlashInvisibleKeys,
    ::testing::Values(InvisibleKeyCase{"causal_d64_bf16", DType::kBFloat16, 64, false, 0.0},
                      InvisibleKeyCase{"causal_d64_bf16_softcap", DType::kBFloat16, 64, false, 1.0},
                      InvisibleKeyCase{"window_d64_fp16_softcap", DType::kFloat16, 64, true, 1.0},
                      InvisibleKeyCase{"causal_d128_bf16_softcap", DType::kBFloat16, 128, false,
                                       1.0},
                      InvisibleKeyCase{"window_d128_bf16", DType::kBFloat16, 128, true, 0.0}),
    [](const ::testing::TestParamInfo<InvisibleKeyCase>& info) { return info.param.name; });

}  // namespace
}  // namespace dpa::test
