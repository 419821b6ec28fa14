// The `cpu` backend: tiled online-softmax forward and FA2-style backward in fp32, multithreaded
// and deterministic. It honours every feature of DESIGN.md §3-5 for host tensors; the design
// note is docs/cpu_backend.md.
#include "cpu/cpu_backends.h"
#include "cpu/tiled_passes.h"

namespace dpa {
namespace {

Capabilities tiled_capabilities() {
  Capabilities caps;
  caps.kind = BackendKind::kCpu;
  caps.available = true;
  caps.device = Device::kCPU;
  caps.dtypes = {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64};
  caps.max_head_dim = 0;  // any head dim; tiles are sized at run time
  caps.different_head_dims = true;
  caps.formats = {Format::kBSHD, Format::kSBHD, Format::kTHD};
  caps.mask_types = {
      MaskType::kNoMask,        MaskType::kPadding,           MaskType::kCausal,
      MaskType::kPaddingCausal, MaskType::kCausalBottomRight, MaskType::kPaddingCausalBottomRight,
      MaskType::kArbitrary};
  caps.window = true;
  caps.padded_offsets = true;
  caps.bias_types = {BiasType::kNoBias, BiasType::kPreScale, BiasType::kPostScale};
  caps.bias_grad = true;
  caps.alibi = true;
  caps.softcap = true;
  caps.softmax_types = {SoftmaxType::kVanilla, SoftmaxType::kOffByOne, SoftmaxType::kLearnable};
  caps.sink_grad = true;
  caps.dropout = true;
  caps.backward = true;
  caps.deterministic = true;  // every output element has one owner task (tiled_backward.cc)
  // Context-parallel tiles (global positions, sink-free partials, backward from a given LSE)
  // are not implemented in the tiled kernels; the selector sends them to cpu_exact.
  caps.cp_tiles = false;
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
