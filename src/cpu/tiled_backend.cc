// The `cpu` backend: tiled online-softmax forward and FA2-style backward in fp32, multithreaded
// and deterministic. It honours every feature of DESIGN.md §3-5 for host tensors; the design
// note is docs/cpu_backend.md.
#include "cpu/cpu_backends.h"
#include "cpu/tiled_passes.h"

namespace dpa {
namespace {

Capabilities tiled_capabilities() {
  Capabilities caps = full_feature_capabilities(BackendKind::kCpu, Device::kCPU);
  caps.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  // Any head dim (tiles are sized at run time); deterministic because every output element
  // has one owner task (tiled_backward.cc).
  // Context-parallel tiles: global positions (diagonal, ALiBi, dropout, bias and mask reads)
  // come from attention_math.h / AttentionProblem's global_* helpers, the sink-free partial
  // from sink_logit, the backward always uses the given LSE, and dbias adds into the
  // unsharded accumulator (write_bias_grad).
  caps.cp_tiles = true;
  caps.extra_rules.push_back(refuse_tile_local_dbias);
  return caps;
}

class CpuTiledBackend final : public Backend {
 public:
  const Capabilities& capabilities() const override { return capabilities_; }
  void forward(const AttentionProblem& problem) const override { cpu::tiled_forward(problem); }
  void backward(const AttentionProblem& problem) const override { cpu::tiled_backward(problem); }

 private:
  Capabilities capabilities_ = tiled_capabilities();
};

}  // namespace

const Backend& cpu_tiled_backend() {
  static const CpuTiledBackend backend;
  return backend;
}

}  // namespace dpa
