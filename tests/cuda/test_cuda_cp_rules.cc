// What the CUDA backends promise about context-parallel tiles, checked through the selector on
// their real capabilities (no GPU needed: the rules read the request, not the device).
#include <gtest/gtest.h>

#include <string>

#include "core/problem.h"
#include "core/selector.h"

namespace dpa {
namespace {

const Capabilities& capabilities_of(BackendKind kind) {
  for (const Backend* backend : registered_backends())
    if (backend->capabilities().kind == kind) return backend->capabilities();
  throw std::runtime_error("backend not registered");
}

bool refused_for(BackendKind kind, const FeatureRequest& request, const std::string& words) {
  const Selection selection = select_backend(request, {&capabilities_of(kind)}, kind);
  for (const BackendVerdict& verdict : selection.verdicts)
    for (const std::string& reason : verdict.reasons)
      if (reason.find(words) != std::string::npos) return true;
  return false;
}

FeatureRequest cp_tile_request() {
  FeatureRequest r;
  r.device = Device::kCUDA;
  r.dtype = DType::kBFloat16;
  r.format = Format::kTHD;
  r.head_dim_qk = r.head_dim_v = 128;
  r.cp_tile = true;
  r.device_arch = 90;
  return r;
}

TEST(CudaCpRules, FlashRefusesDropoutOnlyWhenTheTilesKeysAreUnaligned) {
  FeatureRequest r = cp_tile_request();
  r.dropout = true;
  EXPECT_FALSE(refused_for(BackendKind::kCudaFlash, r, "multiple of 8"));
  EXPECT_FALSE(refused_for(BackendKind::kCudaFlash, r, "context-parallel tiles ("));
  r.cp_keys_unaligned = true;
  EXPECT_TRUE(refused_for(BackendKind::kCudaFlash, r, "multiple of 8"));
  EXPECT_FALSE(refused_for(BackendKind::kCudaUnfused, r, "multiple of 8"));
}

TEST(CudaCpRules, TileBiasGradientsGoTileLocalOnTheGpuAndUnshardedOnTheHost) {
  FeatureRequest r = cp_tile_request();
  r.pass = Pass::kBackward;
  r.bias_type = BiasType::kPostScale;
  r.bias_grad = true;
  r.cp_dbias_unsharded = true;
  EXPECT_TRUE(refused_for(BackendKind::kCudaUnfused, r, "unsharded dbias"));
  r.cp_dbias_unsharded = false;
  r.cp_dbias_local = true;
  EXPECT_FALSE(refused_for(BackendKind::kCudaUnfused, r, "unsharded dbias"));
  r.device = Device::kCPU;
  EXPECT_TRUE(refused_for(BackendKind::kCpuExact, r, "tile-local bias gradient"));
  EXPECT_TRUE(refused_for(BackendKind::kCpu, r, "tile-local bias gradient"));
}

// make_feature_request marks a tile whose first key of some sequence is not a multiple of 8,
// and which contract a tile's bias gradient follows.
TEST(CudaCpRules, UnalignedKeysComeFromTheTilesPositions) {
  AttentionProblem p;
  p.batch = 2;
  p.cp_q_position = {0, 0};
  p.cp_kv_position = {32, 64};
  p.cp_global_diagonal = {0, 0};
  EXPECT_FALSE(make_feature_request(p).cp_keys_unaligned);
  p.cp_kv_position = {32, 60};
  EXPECT_TRUE(make_feature_request(p).cp_keys_unaligned);
  p.wants_dbias = true;
  EXPECT_TRUE(make_feature_request(p).cp_dbias_unsharded);
  EXPECT_FALSE(make_feature_request(p).cp_dbias_local);
  p.cp_dbias_local = true;
  EXPECT_TRUE(make_feature_request(p).cp_dbias_local);
  EXPECT_FALSE(make_feature_request(p).cp_dbias_unsharded);
}

}  // namespace
}  // namespace dpa
