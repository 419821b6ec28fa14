// cuda_unfused: cuBLAS batched GEMMs plus fused elementwise row kernels. O(b*H*sq*skv) memory,
// every feature, forward and backward, deterministic. The GPU reference for the fused kernels
// and the fallback for what they do not cover (arbitrary masks, bias gradients, any head dim).
#include <optional>
#include <string>

#include "core/backend.h"
#include "cuda/cuda_backends.h"
#include "cuda/runtime.h"
#include "cuda/unfused/unfused_passes.h"
#include "cuda/unfused/unfused_workspace.h"

namespace dpa {
namespace {

class CudaUnfusedBackend final : public Backend {
 public:
  CudaUnfusedBackend() {
    caps_ = full_feature_capabilities(BackendKind::kCudaUnfused, Device::kCUDA);
    caps_.available = cuda::device_info(0).present;
    if (!caps_.available) caps_.unavailable_reason = "no CUDA device";
    caps_.min_arch = 80;
    // fp32 storage is accepted too (fp32 GEMMs without TF32): a tight GPU reference.
    caps_.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32};
    // GEMMs and row kernels take any head dim, and dqk != dv.
    caps_.max_head_dim = 0;
    caps_.different_head_dims = true;
    // No atomics: fixed-order block reductions, GQA sums by sequential beta = 1 GEMMs, and a
    // per-call cuBLAS workspace (cuBLAS is bit-reproducible on one stream and architecture).
    caps_.deterministic = true;
    caps_.size_limit = cuda::unfused_size_limit;
    // Context-parallel tiles: global diagonal, dropout coordinates, unsharded bias / mask reads,
    // sink-free partials and the given-LSE backward (unfused_row_math.cuh). The bias gradient
    // only tile-local (cp.dbias_local): its reduction writes the tile's own layout.
    caps_.cp_tiles = true;
    caps_.extra_rules.push_back([](const FeatureRequest& r) -> std::optional<std::string> {
      if (r.cp.dbias_unsharded)
        return "the bias gradient of a context-parallel tile goes into the unsharded dbias only "
               "on the host backends (the GPU tiles write it tile-local)";
      return std::nullopt;
    });
  }

  const Capabilities& capabilities() const override { return caps_; }

  void forward(const AttentionProblem& problem) const override {
    cuda::run_unfused_forward(problem);
  }

  void backward(const AttentionProblem& problem) const override {
    cuda::run_unfused_backward(problem);
  }

  size_t workspace_bytes(const AttentionProblem& problem) const override {
    return cuda::unfused_call_workspace_bytes(problem);
  }

 private:
  Capabilities caps_;
};

}  // namespace

const Backend& cuda_unfused_backend() {
  static const CudaUnfusedBackend backend;
  return backend;
}

}  // namespace dpa
