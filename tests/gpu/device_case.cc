#include "gpu/device_case.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dpa::test {
namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// A stream of the test's own. Non-blocking, so that a backend which ignored ForwardArgs::stream
// and ran on the legacy default stream would race with the poisoning and the download instead
// of being silently serialised with them.
class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// The device inputs of one case; optional tensors stay undefined when the case has none.
struct DeviceInputs {
  DeviceTensor q, k, v, d_o;
  DeviceTensor cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded;
  DeviceTensor bias, alibi_slopes, softmax_offset, attn_mask;

  explicit DeviceInputs(const CaseTensors& t) : q(t.q), k(t.k), v(t.v), d_o(t.d_o) {
    auto upload = [](const HostTensor& host, DeviceTensor& device) {
      if (host.defined()) device = DeviceTensor(host);
    };
    upload(t.cu_seqlens_q, cu_seqlens_q);
    upload(t.cu_seqlens_kv, cu_seqlens_kv);
    upload(t.cu_seqlens_q_padded, cu_seqlens_q_padded);
    upload(t.cu_seqlens_kv_padded, cu_seqlens_kv_padded);
    upload(t.bias, bias);
    upload(t.alibi_slopes, alibi_slopes);
    upload(t.softmax_offset, softmax_offset);
    upload(t.attn_mask, attn_mask);
  }

  AttentionInputs inputs() const {
    AttentionInputs in;
    in.q = q.view();
    in.k = k.view();
    in.v = v.view();
    auto set = [](const DeviceTensor& device, TensorView& view) {
      if (device.defined()) view = device.view();
    };
    set(cu_seqlens_q, in.cu_seqlens_q);
    set(cu_seqlens_kv, in.cu_seqlens_kv);
    set(cu_seqlens_q_padded, in.cu_seqlens_q_padded);
    set(cu_seqlens_kv_padded, in.cu_seqlens_kv_padded);
    set(bias, in.bias);
    set(alibi_slopes, in.alibi_slopes);
    set(softmax_offset, in.softmax_offset);
    set(attn_mask, in.attn_mask);
    return in;
  }
};

std::string describe(const char* name, double error, double tolerance) {
  return std::string(name) + " relative error " + std::to_string(error) + " (tolerance " +
         std::to_string(tolerance) + ")";
}

// A graph replays a captured copy from host memory from the captured address, which a call's
// temporary tables no longer own by then (the released bytes usually still hold the values, so
// a replay's results could not show it): no copy node of a captured call may read the host.
void check_no_host_reads(cudaGraph_t graph) {
  size_t count = 0;
  check(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  check(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type = cudaGraphNodeTypeEmpty;
    check(cudaGraphNodeGetType(node, &type), "cudaGraphNodeGetType");
    if (type != cudaGraphNodeTypeMemcpy) continue;
    cudaMemcpy3DParms copy = {};
    check(cudaGraphMemcpyNodeGetParams(node, &copy), "cudaGraphMemcpyNodeGetParams");
    if (copy.srcPtr.ptr == nullptr) continue;  // from an array: device memory
    cudaPointerAttributes source = {};
    check(cudaPointerGetAttributes(&source, copy.srcPtr.ptr), "cudaPointerGetAttributes");
    if (source.type == cudaMemoryTypeUnregistered || source.type == cudaMemoryTypeHost)
      throw std::runtime_error("the captured call copies from host memory at every replay");
  }
}

}  // namespace

void run_captured(void* stream, const std::function<void()>& call) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  check(cudaStreamBeginCapture(cuda_stream, cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    call();
  } catch (...) {
    if (cudaStreamEndCapture(cuda_stream, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // a capture the call invalidated
    throw;
  }
  check(cudaStreamEndCapture(cuda_stream, &graph), "cudaStreamEndCapture");
  try {
    check_no_host_reads(graph);
  } catch (...) {
    cudaGraphDestroy(graph);
    throw;
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(instantiated, "cudaGraphInstantiate");
  const cudaError_t launched = cudaGraphLaunch(exec, cuda_stream);
  const cudaError_t finished = cudaStreamSynchronize(cuda_stream);
  cudaGraphExecDestroy(exec);
  check(launched, "cudaGraphLaunch");
  check(finished, "cudaStreamSynchronize after the graph");
}

bool gpu_present(std::string* why) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" status
    if (why) *why = std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = "cudaGetDeviceProperties failed";
    return false;
  }
  if (prop.major < 8) {
    if (why) *why = std::string(prop.name) + " is older than sm_80";
    return false;
  }
  return true;
}

bool reference_only_mode() {
  const char* value = std::getenv("DPA_GPU_TESTS_REFERENCE_ONLY");
  return value && *value && std::string(value) != "0";
}

CaseOutputs run_device_case(const CaseSpec& spec, const CaseTensors& t, BackendKind backend,
                            bool backward, DeviceCallMode mode) {
  AttentionConfig config = spec.config;
  config.backend = backend;
  DotProductAttention attention(config);
  Stream stream;
  const DeviceInputs device(t);

  // Output shapes as run_case makes them.
  const bool thd = config.format == Format::kTHD;
  std::vector<int64_t> lse_shape;
  if (thd)
    lse_shape = {spec.heads_q, t.q.shape()[0]};
  else
    lse_shape = {spec.batch, spec.heads_q,
                 config.format == Format::kBSHD ? t.q.shape()[1] : t.q.shape()[0]};
  DeviceTensor o(spec.dtype, t.d_o.shape());
  DeviceTensor lse(DType::kFloat32, lse_shape);

  ForwardArgs fwd;
  fwd.in = device.inputs();
  fwd.o = o.view();
  fwd.lse = lse.view();
  fwd.rng = RngState{config.seed, 7};
  fwd.stream = stream.get();
  o.poison(stream.get());
  lse.poison(stream.get());
  CaseOutputs out;
  // The caller's workspace: exactly the queried bytes, poisoned like the outputs, so a buffer a
  // backend forgets to initialise or sizes wrong shows up (shortfall, NaN, or other bits).
  DeviceTensor forward_workspace;
  if (mode.caller_workspace) {
    const size_t bytes = attention.workspace_size(fwd);
    forward_workspace = DeviceTensor(DType::kBool, {int64_t(bytes)});
    forward_workspace.poison(stream.get());
    fwd.workspace.data = forward_workspace.view().data;
    fwd.workspace.bytes = bytes;
  }
  ForwardResult result;
  auto run_forward = [&] { result = attention.forward(fwd); };
  if (mode.captured)
    run_captured(stream.get(), run_forward);
  else
    run_forward();
  out.forward_backend = result.backend;
  out.o = o.download(stream.get());
  out.lse = lse.download(stream.get());
  if (!backward) return out;

  DeviceTensor dq(spec.dtype, t.q.shape());
  DeviceTensor dk(spec.dtype, t.k.shape());
  DeviceTensor dv(spec.dtype, t.v.shape());
  DeviceTensor dbias, dsoftmax_offset;
  BackwardArgs bwd;
  bwd.in = fwd.in;
  bwd.o = o.view();
  bwd.lse = lse.view();
  bwd.d_o = device.d_o.view();
  bwd.dq = dq.view();
  bwd.dk = dk.view();
  bwd.dv = dv.view();
  bwd.rng = result.rng;
  bwd.stream = stream.get();
  if (t.bias.defined() && spec.want_dbias) {
    dbias = DeviceTensor(t.bias.dtype(), t.bias.shape());
    bwd.dbias = dbias.view();
  }
  if (t.softmax_offset.defined() && spec.want_dsoftmax_offset) {
    dsoftmax_offset = DeviceTensor(DType::kFloat32, t.softmax_offset.shape());
    bwd.dsoftmax_offset = dsoftmax_offset.view();
  }
  DeviceTensor backward_workspace;
  if (mode.caller_workspace) {
    const size_t bytes = attention.workspace_size(bwd);
    backward_workspace = DeviceTensor(DType::kBool, {int64_t(bytes)});
    backward_workspace.poison(stream.get());
    bwd.workspace.data = backward_workspace.view().data;
    bwd.workspace.bytes = bytes;
  }
  auto run_backward = [&] { out.backward_backend = attention.backward(bwd); };
  if (mode.captured)
    run_captured(stream.get(), run_backward);
  else
    run_backward();
  out.dq = dq.download(stream.get());
  out.dk = dk.download(stream.get());
  out.dv = dv.download(stream.get());
  if (dbias.defined()) out.dbias = dbias.download(stream.get());
  if (dsoftmax_offset.defined()) out.dsoftmax_offset = dsoftmax_offset.download(stream.get());
  return out;
}

double output_tolerance(DType dtype) {
  // bf16: 2^-9 relative rounding of P and of o, several times over; fp16 has 3 more bits;
  // fp32 storage (cuda_unfused) only fp32 accumulation.
  if (dtype == DType::kFloat32) return 1e-4;
  return dtype == DType::kBFloat16 ? 2e-2 : 5e-3;
}

double gradient_tolerance(DType dtype) {
  // Gradients chain two more rounded products (dP = dO V^T, dS = P (dP - D)) than o.
  if (dtype == DType::kFloat32) return 2e-4;
  return dtype == DType::kBFloat16 ? 3e-2 : 1e-2;
}

double softcap_moves_o(const CaseSpec& spec, const CaseTensors& tensors) {
  CaseSpec uncapped = spec;
  uncapped.config.softcap = 0.0;
  return relative_error(run_case(spec, tensors, BackendKind::kCpuExact, false).o,
                        run_case(uncapped, tensors, BackendKind::kCpuExact, false).o);
}

double lse_violation(const HostTensor& got, const HostTensor& ref) {
  if (got.numel() != ref.numel()) return std::numeric_limits<double>::infinity();
  double worst = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double x = got.get(i), y = ref.get(i);
    if (x == y) continue;  // equal infinities (empty rows without a sink) included
    if (std::isnan(x) || std::isnan(y) || std::isinf(x) || std::isinf(y))
      return std::numeric_limits<double>::infinity();
    worst = std::max(
        worst, std::fabs(x - y) / (kLseAbsoluteTolerance + kLseRelativeTolerance * std::fabs(y)));
  }
  return worst;
}

// Where a failing output is worst, for debugging a kernel from the log alone: the element with
// the largest absolute error (the first NaN, if any) in the tensor's coordinates, its values,
// and how many elements are NaN.
std::string worst_element(const HostTensor& got, const HostTensor& ref) {
  if (got.numel() != ref.numel()) return "; shapes differ";
  int64_t worst = -1, nans = 0;
  double worst_error = -1;
  for (int64_t n = 0; n < got.numel(); ++n) {
    const double x = got.get(n), y = ref.get(n);
    const bool nan = std::isnan(x) || std::isnan(y);
    nans += nan;
    const double error = nan ? std::numeric_limits<double>::infinity() : std::fabs(x - y);
    if (error > worst_error && !(nan && worst_error == std::numeric_limits<double>::infinity())) {
      worst_error = error;
      worst = n;
    }
  }
  if (worst < 0) return "";
  std::vector<int64_t> coordinates(got.shape().size());
  int64_t rest = worst;
  for (size_t axis = coordinates.size(); axis-- > 0;) {
    coordinates[axis] = rest % got.shape()[axis];
    rest /= got.shape()[axis];
  }
  std::string at = "; worst at [";
  for (size_t axis = 0; axis < coordinates.size(); ++axis)
    at += (axis ? ", " : "") + std::to_string(coordinates[axis]);
  return at + "]: got " + std::to_string(got.get(worst)) + ", want " +
         std::to_string(ref.get(worst)) + "; " + std::to_string(nans) + " NaN";
}

void expect_matches_reference(const CaseOutputs& got, const CaseOutputs& reference, DType dtype,
                              bool backward, const std::string& what) {
  SCOPED_TRACE(what);
  // A comparison with a zero reference proves nothing.
  EXPECT_GT(norm(reference.o), 0.0) << "the reference o is zero";
  EXPECT_FALSE(has_nan(got.o)) << "o has NaN (an element left unwritten is NaN)";
  EXPECT_FALSE(has_nan(got.lse)) << "lse has NaN (an element left unwritten is NaN)";
  const double o_tolerance = output_tolerance(dtype);
  const double o_error = relative_error(got.o, reference.o);
  EXPECT_LE(o_error, o_tolerance) << describe("o", o_error, o_tolerance) << "; max abs error "
                                  << max_abs_error(got.o, reference.o)
                                  << worst_element(got.o, reference.o);
  const double lse_error = lse_violation(got.lse, reference.lse);
  EXPECT_LE(lse_error, 1.0) << "lse differs by " << lse_error << "x its tolerance ("
                            << kLseAbsoluteTolerance << " + " << kLseRelativeTolerance
                            << " |ref|); max abs error " << max_abs_error(got.lse, reference.lse)
                            << worst_element(got.lse, reference.lse);
  if (!backward) return;

  const double g_tolerance = gradient_tolerance(dtype);
  struct Gradient {
    const char* name;
    const HostTensor& got;
    const HostTensor& ref;
  };
  const Gradient gradients[] = {
      {"dq", got.dq, reference.dq},
      {"dk", got.dk, reference.dk},
      {"dv", got.dv, reference.dv},
      {"dbias", got.dbias, reference.dbias},
      {"dsoftmax_offset", got.dsoftmax_offset, reference.dsoftmax_offset}};
  for (const Gradient& g : gradients) {
    EXPECT_EQ(g.got.defined(), g.ref.defined()) << g.name << " was (not) produced";
    if (!g.got.defined() || !g.ref.defined()) continue;
    EXPECT_FALSE(has_nan(g.got)) << g.name << " has NaN (an element left unwritten is NaN)";
    if (norm(g.ref) == 0.0) {
      // A gradient that is exactly zero by construction (e.g. dq and dk when every row sees
      // a single key: the softmax of one logit does not depend on it) must come out zero up
      // to rounding: D = dO.o uses the rounded o, so dP - D is ~1e-3 of |dO| |v|, not 0.
      EXPECT_LE(norm(g.got), 1e-4 * std::max(1.0, norm(reference.dv)))
          << "the reference " << g.name << " is zero but ours is not";
      continue;
    }
    const double error = relative_error(g.got, g.ref);
    EXPECT_LE(error, g_tolerance) << describe(g.name, error, g_tolerance) << "; max abs error "
                                  << max_abs_error(g.got, g.ref) << worst_element(g.got, g.ref);
  }
}

namespace {

struct CachedCase {
  std::unique_ptr<CaseTensors> tensors;
  std::unique_ptr<CaseOutputs> reference;
  bool reference_has_backward = false;
};

std::map<std::string, CachedCase>& case_cache() {
  static std::map<std::string, CachedCase> cache;
  return cache;
}

}  // namespace

const CaseTensors& cached_tensors(const std::string& name,
                                  const std::function<CaseTensors()>& make) {
  CachedCase& entry = case_cache()[name];
  if (!entry.tensors) entry.tensors = std::make_unique<CaseTensors>(make());
  return *entry.tensors;
}

const CaseOutputs& exact_reference(const std::string& name, const CaseSpec& spec,
                                   const CaseTensors& tensors, bool backward) {
  CachedCase& entry = case_cache()[name];
  if (!entry.reference || (backward && !entry.reference_has_backward)) {
    // A copy of the outputs, never an alias of anything a backend writes (DESIGN.md §9).
    entry.reference =
        std::make_unique<CaseOutputs>(run_case(spec, tensors, BackendKind::kCpuExact, backward));
    entry.reference_has_backward = backward;
  }
  return *entry.reference;
}

}  // namespace dpa::test
