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
  r.cp.tile = true;
  r.device_arch = 90;
  return r;
}

TEST(CudaCpRules, FlashRefusesDropoutOnlyWhenTheTilesKeysAreUnaligned) {
  FeatureRequest r = cp_tile_request();
  r.dropout = true;
  EXPECT_FALSE(refused_for(BackendKind::kCudaFlash, r, "multiple of 8"));
  EXPECT_FALSE(refused_for(BackendKind::kCudaFlash, r, "context-parallel tiles ("));
  r.cp.keys_unaligned = true;
  EXPECT_TRUE(refused_for(BackendKind::kCudaFlash, r, "multiple of 8"));
  EXPECT_FALSE(refused_for(BackendKind::kCudaUnfused, r, "multiple of 8"));
}

TEST(CudaCpRules, TileBiasGradientsGoTileLocalOnTheGpuAndUnshardedOnTheHost) {
  FeatureRequest r = cp_tile_request();
  r.pass = Pass::kBackward;
  r.bias_type = BiasType::kPostScale;
  r.bias_grad = true;
  r.cp.dbias_unsharded = true;
  EXPECT_TRUE(refused_for(BackendKind::kCudaUnfused, r, "unsharded dbias"));
  r.cp.dbias_unsharded = false;
  r.cp.dbias_local = true;
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
  p.cp.q_position = {0, 0};
  p.cp.kv_position = {32, 64};
  p.cp.global_diagonal = {0, 0};
  EXPECT_FALSE(make_feature_request(p).cp.keys_unaligned);
  p.cp.kv_position = {32, 60};
  EXPECT_TRUE(make_feature_request(p).cp.keys_unaligned);
  p.wants_dbias = true;
  EXPECT_TRUE(make_feature_request(p).cp.dbias_unsharded);
  EXPECT_FALSE(make_feature_request(p).cp.dbias_local);
  p.cp.dbias_local = true;
  EXPECT_TRUE(make_feature_request(p).cp.dbias_local);
  EXPECT_FALSE(make_feature_request(p).cp.dbias_unsharded);
}

}  // namespace
}  // namespace dpa
