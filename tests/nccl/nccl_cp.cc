// Context parallelism across processes over NCCL (nccl_cp.h). Every rank builds the same
// inputs (make_case is seeded), computes the unsharded call on its own GPU as the reference,
// then runs its shard through ContextParallelAttention over the host-staged NCCL communicator
// and compares what it got with its shard of the reference.
#include "nccl_cp.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cp/device_ring.h"
#include "dpa/cp.h"
#include "support/attention_case.h"
#include "support/cp_case.h"
#include "support/device_tensor.h"

namespace dpa::nccl_test {
namespace {

using test::CaseSpec;
using test::CaseTensors;
using test::DeviceTensor;
using test::HostTensor;
using Clock = std::chrono::steady_clock;

void cuda_ok(cudaError_t error, const char* what) {
  if (error != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(error));
}

// The forward and backward outputs of one call; `lse_shape` as the backends store it.
struct Outputs {
  HostTensor o, lse, dq, dk, dv, dalpha;
};

std::vector<int64_t> lse_shape_of(const CaseSpec& spec, int64_t rows) {
  if (spec.config.format == Format::kTHD) return {spec.heads_q, rows};
  return {spec.batch, spec.heads_q, rows};
}

// One call's tensors on this rank's GPU: the inputs of `t` (q, k, v and dO given separately:
// the full ones or a shard) and every output.
class DeviceCall {
 public:
  DeviceCall(const CaseSpec& spec, const CaseTensors& t, const HostTensor& q, const HostTensor& k,
             const HostTensor& v, const HostTensor& d_o, const std::vector<int64_t>& lse_shape,
             int device)
      : q_(q, device),
        k_(k, device),
        v_(v, device),
        d_o_(d_o, device),
        o_(spec.dtype, d_o.shape(), device),
        lse_(DType::kFloat32, lse_shape, device),
        dq_(spec.dtype, q.shape(), device),
        dk_(spec.dtype, k.shape(), device),
        dv_(spec.dtype, v.shape(), device) {
    if (t.softmax_offset.defined()) {
      offsets_ = DeviceTensor(t.softmax_offset, device);
      dalpha_ = DeviceTensor(DType::kFloat32, {spec.heads_q}, device);
    }
    if (t.alibi_slopes.defined()) slopes_ = DeviceTensor(t.alibi_slopes, device);
    in_ = t.inputs();  // host sequence tables (unsharded lengths)
    in_.q = q_.view();
    in_.k = k_.view();
    in_.v = v_.view();
    in_.softmax_offset = offsets_.defined() ? offsets_.view() : TensorView{};
    in_.alibi_slopes = slopes_.defined() ? slopes_.view() : TensorView{};
    seed_ = spec.config.seed;
  }

  // Forward alone; returns when the GPU is done.
  void run_forward(const std::function<ForwardResult(const ForwardArgs&)>& forward) {
    ForwardArgs fwd;
    fwd.in = in_;
    fwd.o = o_.view();
    fwd.lse = lse_.view();
    fwd.rng = RngState{seed_, 7};
    forward(fwd);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  // Forward, then backward; returns when the GPU is done.
  void run(const std::function<ForwardResult(const ForwardArgs&)>& forward,
           const std::function<void(const BackwardArgs&)>& backward) {
    ForwardArgs fwd;
    fwd.in = in_;
    fwd.o = o_.view();
    fwd.lse = lse_.view();
    fwd.rng = RngState{seed_, 7};
    const ForwardResult result = forward(fwd);
    BackwardArgs bwd;
    bwd.in = in_;
    bwd.o = o_.view();
    bwd.lse = lse_.view();
    bwd.d_o = d_o_.view();
    bwd.dq = dq_.view();
    bwd.dk = dk_.view();
    bwd.dv = dv_.view();
    bwd.rng = result.rng;
    if (dalpha_.defined()) bwd.dsoftmax_offset = dalpha_.view();
    backward(bwd);
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }

  Outputs download() const {
    Outputs out;
    out.o = o_.download();
    out.lse = lse_.download();
    out.dq = dq_.download();
    out.dk = dk_.download();
    out.dv = dv_.download();
    if (dalpha_.defined()) out.dalpha = dalpha_.download();
    return out;
  }

 private:
  DeviceTensor q_, k_, v_, d_o_, o_, lse_, dq_, dk_, dv_, offsets_, dalpha_, slopes_;
  AttentionInputs in_;
  uint64_t seed_ = 0;
};

// The inputs a DeviceCall of these shards passes, as device_ring_refusal sees them (it reads
// shapes and placement only).
AttentionInputs device_shaped(const CaseTensors& t, const HostTensor& q, const HostTensor& k,
                              const HostTensor& v) {
  AttentionInputs in = t.inputs();
  for (auto [view, host] : {std::pair{&in.q, &q}, {&in.k, &k}, {&in.v, &v}}) {
    *view = host->view();
    view->device = Device::kCUDA;
  }
  for (TensorView* view : {&in.softmax_offset, &in.alibi_slopes})
    if (view->defined()) view->device = Device::kCUDA;
  return in;
}

// LSE within 5e-3 + 1e-3 |ref| everywhere (equal infinities count as equal); the worst ratio.
double lse_violation(const HostTensor& got, const HostTensor& ref) {
  double worst = 0;
  for (int64_t n = 0; n < ref.numel(); ++n) {
    const double a = got.get(n), b = ref.get(n);
    if (a == b) continue;
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    worst = std::max(worst, std::fabs(a - b) / (5e-3 + 1e-3 * std::fabs(b)));
  }
  return worst;
}

struct CpCase {
  std::string name;
  CaseSpec spec;
};

// The context-parallelism issue's configurations at `seqlen` tokens, bf16, d = 128.
std::vector<CpCase> cp_cases(int64_t seqlen) {
  auto base = [&] {
    CaseSpec s;
    s.dtype = DType::kBFloat16;
    s.batch = 1;
    s.seqlen_q = s.seqlen_kv = seqlen;
    s.heads_q = 16;
    s.heads_kv = 4;
    s.head_dim_qk = s.head_dim_v = 128;
    s.qk_stddev = 1.0;
    return s;
  };
  std::vector<CpCase> cases;
  CaseSpec s = base();
  s.config.mask_type = MaskType::kCausal;
  cases.push_back({"causal_gqa", s});
  s = base();
  s.config.window_left = s.config.window_right = 512;
  cases.push_back({"window512_gqa", s});
  s = base();
  s.config.mask_type = MaskType::kCausal;
  s.config.window_left = 128;
  s.config.softmax_type = SoftmaxType::kLearnable;
  cases.push_back({"causal_window128_sink", s});
  s = base();
  s.config.mask_type = MaskType::kCausal;
  s.head_dim_qk = 192;
  s.heads_kv = 16;
  cases.push_back({"mla_192_128", s});
  s = base();
  s.config.mask_type = MaskType::kCausal;
  s.config.softmax_type = SoftmaxType::kOffByOne;
  cases.push_back({"off_by_one", s});
  s = base();
  s.config.mask_type = MaskType::kCausal;
  s.config.softcap = 1.0;
  s.config.scale = 1.0;
  s.config.softmax_type = SoftmaxType::kLearnable;
  cases.push_back({"softcap1_sink", s});
  s = base();
  s.config.format = Format::kTHD;
  s.config.mask_type = MaskType::kPaddingCausalBottomRight;
  s.config.softmax_type = SoftmaxType::kLearnable;
  s.lengths_q =
      s.lengths_kv = {int32_t(seqlen / 2 + 37), int32_t(seqlen / 4 - 11), int32_t(seqlen / 8 + 5)};
  cases.push_back({"thd_uneven", s});
  // The device ring's other shapes: sbhd, no mask (every step all on all), softcap + sink.
  s = base();
  s.config.format = Format::kSBHD;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = seqlen / 2;
  s.config.softcap = 30.0;
  s.config.softmax_type = SoftmaxType::kLearnable;
  cases.push_back({"sbhd_full_softcap_sink", s});
  s = base();
  s.config.mask_type = MaskType::kCausal;
  s.config.dropout = 0.1;
  s.config.seed = 1234;
  s.config.softmax_type = SoftmaxType::kLearnable;
  cases.push_back({"dropout", s});
  return cases;
}

// a2a shards the 16 query heads: world sizes that divide 16.
std::vector<test::CpLayout> layouts_for(int size) {
  std::vector<test::CpLayout> layouts = {{CpCommType::kP2P, size, 0},
                                         {CpCommType::kAllGather, size, 0}};
  if (16 % size == 0) layouts.push_back({CpCommType::kA2A, size, 0});
  if (size >= 4 && size % 2 == 0) layouts.push_back({CpCommType::kA2AP2P, size, 2});
  return layouts;
}

// Every rank learns whether any rank failed `step`, so that all fail together instead of the
// others waiting for the failed one inside a CP exchange.
void agree(Communicator& comm, const std::string& what, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<float> failed(1, error.empty() ? 0.f : 1.f);
  comm.all_reduce(failed.data(), 1, DType::kFloat32)->wait();
  if (!error.empty()) throw std::runtime_error(what + ": " + error);
  if (failed[0] > 0.f) throw std::runtime_error(what + ": failed on another rank");
}

}  // namespace

void run_cp_correctness(const LaunchEnv& env, int device, const CpPhaseSettings& settings) {
  if (settings.seqlen <= 0) return;
  std::unique_ptr<NcclCommunicator> nccl = make_nccl_communicator(
      env.rank, env.size, device, NcclBootstrap::from_file(settings.id_file, settings.id_key),
      std::chrono::milliseconds(600000));
  std::unique_ptr<Communicator> comm = make_host_staged_communicator(*nccl);
  const int cp = env.size, rank = env.rank;
  // The same check on every rank: a length the dual-chunk split (and thd_uneven) cannot take
  // fails everywhere alike, before any exchange.
  require(settings.seqlen >= 64 && settings.seqlen % (2 * cp) == 0, "cp-seqlen",
          "must be at least 64 and a multiple of 2 * cp = " + std::to_string(2 * cp) + ", got " +
              std::to_string(settings.seqlen));
  int failures = 0;
  for (const CpCase& c : cp_cases(settings.seqlen)) {
    CaseSpec spec = c.spec;
    test::pad_thd_for_cp(spec, cp);
    const CaseTensors t = test::make_case(spec);
    const Format format = spec.config.format;
    const bool thd = format == Format::kTHD;
    const std::vector<int64_t> full_lse = lse_shape_of(spec, thd ? t.q.shape()[0] : spec.seqlen_q);

    const bool ring_only = settings.ring_only;
    if (ring_only && !cp::device_ring_refusal(spec.config, CpConfig{},
                                              device_shaped(t, t.q, t.k, t.v), spec.config.dropout)
                          .empty())
      continue;  // same on every rank

    // The reference: the same call without CP on this rank's GPU (once per configuration).
    DotProductAttention single(spec.config);
    Outputs reference;
    BackendKind reference_backward = BackendKind::kAuto;
    agree(*comm, c.name + ": the single-GPU reference", [&] {
      DeviceCall call(spec, t, t.q, t.k, t.v, t.d_o, full_lse, device);
      call.run([&](const ForwardArgs& a) { return single.forward(a); },
               [&](const BackwardArgs& a) { reference_backward = single.backward(a); });
      reference = call.download();
    });

    ThdCpPartition part;
    if (thd) part = thd_cp_partition(spec.lengths_q, cp);
    const std::vector<int32_t>& cu_padded = part.cu_seqlens_padded;
    auto shard = [&](const HostTensor& full) {
      HostTensor local(full.dtype(), test::cp_local_shape(full.shape(), format, cp, part));
      shard_sequence(full.view(), local.view(), format, cp, rank, cu_padded);
      return local;
    };
    std::vector<int64_t> local_lse = full_lse;
    local_lse.back() = thd ? part.local_cu_padded.back() : spec.seqlen_q / cp;
    HostTensor reference_lse(DType::kFloat32, local_lse);
    shard_lse(reference.lse.view(), reference_lse.view(), format, cp, rank, cu_padded);
    const HostTensor q = shard(t.q), k = shard(t.k), v = shard(t.v), d_o = shard(t.d_o);

    // Each layout through the host-staged communicator (the general algorithms), and p2p also
    // through the NCCL communicator itself: the device ring where it applies ("_ring"), else
    // the general algorithms through a host-staged view it makes itself ("_nccl").
    struct Variant {
      test::CpLayout layout;
      bool through_nccl;
      std::string name;
    };
    std::vector<Variant> variants;
    for (const test::CpLayout& layout : layouts_for(cp)) {
      const std::string name = test::cp_layout_name(layout);
      if (!ring_only) variants.push_back({layout, false, name});
      if (layout.type != CpCommType::kP2P) continue;
      const bool ring = cp::device_ring_refusal(spec.config, CpConfig{}, device_shaped(t, q, k, v),
                                                spec.config.dropout)
                            .empty();
      if (ring || !ring_only) variants.push_back({layout, true, name + (ring ? "_ring" : "_nccl")});
    }
    for (const auto& [layout, through_nccl, variant_name] : variants) {
      const auto started = Clock::now();
      CpConfig cp_config;
      cp_config.comm_type = layout.type;
      cp_config.a2a_group_size = layout.group;
      cp_config.reduce_dalpha = true;  // every rank holds the whole gradient
      ContextParallelAttention attention(spec.config, cp_config,
                                         through_nccl ? static_cast<Communicator&>(*nccl) : *comm);
      Outputs got;
      BackendKind tile_backward = BackendKind::kAuto;
      {
        DeviceCall call(spec, t, q, k, v, d_o, local_lse, device);
        call.run([&](const ForwardArgs& a) { return attention.forward(a); },
                 [&](const BackwardArgs& a) { tile_backward = attention.backward(a); });
        got = call.download();
      }

      const double o = test::relative_error(got.o, shard(reference.o));
      const double lse = lse_violation(got.lse, reference_lse);
      const double dq = test::relative_error(got.dq, shard(reference.dq));
      const double dk = test::relative_error(got.dk, shard(reference.dk));
      const double dv = test::relative_error(got.dv, shard(reference.dv));
      const double dalpha =
          reference.dalpha.defined() ? test::relative_error(got.dalpha, reference.dalpha) : 0.0;
      // Both sides are bf16 GPU results: the GPU suite's tolerances against cpu_exact.
      const bool ok =
          o <= 2e-2 && lse <= 1.0 && dq <= 3e-2 && dk <= 3e-2 && dv <= 3e-2 && dalpha <= 3e-2;
      failures += ok ? 0 : 1;
      std::printf(
          "dpa_nccl_tests: rank %d: cp %-22s %-19s s=%lld: o %.1e lse %.2f dq %.1e dk %.1e dv "
          "%.1e dalpha %.1e (backward: reference %s, tiles %s)  %s (%.1f s)\n",
          rank, c.name.c_str(), variant_name.c_str(), static_cast<long long>(spec.seqlen_q), o, lse,
          dq, dk, dv, dalpha, std::string(to_string(reference_backward)).c_str(),
          std::string(to_string(tile_backward)).c_str(), ok ? "ok" : "FAILED",
          std::chrono::duration<double>(Clock::now() - started).count());
      std::fflush(stdout);
    }
  }
  if (failures > 0)
    throw std::runtime_error("context parallelism over NCCL: " + std::to_string(failures) +
                             " configuration(s) differ from the single-GPU result");
}

void run_cp_scaling(const LaunchEnv& env, int device, const CpPhaseSettings& settings) {
  if (settings.bench_seqlen_per_gpu <= 0) return;
  std::unique_ptr<NcclCommunicator> nccl =
      make_nccl_communicator(env.rank, env.size, device,
                             NcclBootstrap::from_file(settings.id_file + ".bench", settings.id_key),
                             std::chrono::milliseconds(600000));
  std::unique_ptr<Communicator> comm = make_host_staged_communicator(*nccl);
  const int cp = env.size;
  auto spec_for = [&](int64_t seqlen) {
    CaseSpec s;
    s.dtype = DType::kBFloat16;
    s.batch = 1;
    s.seqlen_q = s.seqlen_kv = seqlen;
    s.heads_q = s.heads_kv = 16;
    s.head_dim_qk = s.head_dim_v = 128;
    s.config.mask_type = MaskType::kCausal;
    s.config.softcap = 50.0;
    s.config.softmax_type = SoftmaxType::kLearnable;
    return s;
  };
  // Every rank waits for every other before and after a timed step; the slowest rank's time.
  std::vector<float> token(1, 0.f);
  auto barrier = [&] { comm->all_reduce(token.data(), 1, DType::kFloat32)->wait(); };
  auto median_seconds = [&](int runs, const std::function<void()>& step) {
    step();  // warm-up
    std::vector<double> times;
    // DESIGN.md §10's 20 runs, timed on the host clock: every copy belongs to the cost.
    for (int i = 0; i < runs; ++i) {
      barrier();
      const auto start = Clock::now();
      step();  // returns when the GPU is done
      std::vector<float> mine(1,
                              float(std::chrono::duration<double>(Clock::now() - start).count()));
      std::vector<float> all(static_cast<size_t>(cp), 0.f);
      comm->all_gather(mine.data(), all.data(), sizeof(float))->wait();
      times.push_back(*std::max_element(all.begin(), all.end()));
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
  };
  // Causal FLOPs (DESIGN.md §10): the forward's 4 b H s^2 d / 2, 3.5x that with the backward.
  auto flops = [](const CaseSpec& s, bool with_backward) {
    return (with_backward ? 3.5 : 1.0) * 4.0 * double(s.batch) * double(s.heads_q) *
           double(s.seqlen_q) * double(s.seqlen_kv) * double(s.head_dim_qk) / 2.0;
  };
  using Forward = std::function<ForwardResult(const ForwardArgs&)>;
  using Backward = std::function<void(const BackwardArgs&)>;
  // Median seconds of `call`: forward alone, then forward + backward.
  struct Times {
    double forward = 0, forward_backward = 0;
  };
  auto time_call = [&](DeviceCall& call, int runs, const Forward& forward,
                       const Backward& backward) {
    Times times;
    times.forward = median_seconds(runs, [&] { call.run_forward(forward); });
    times.forward_backward = median_seconds(runs, [&] { call.run(forward, backward); });
    return times;
  };
  auto time_attention = [&](const CaseSpec& spec, int runs) {
    const CaseTensors tensors = test::make_case(spec);
    DotProductAttention attention(spec.config);
    DeviceCall call(spec, tensors, tensors.q, tensors.k, tensors.v, tensors.d_o,
                    lse_shape_of(spec, spec.seqlen_q), device);
    return time_call(
        call, runs, [&](const ForwardArgs& a) { return attention.forward(a); },
        [&](const BackwardArgs& a) { attention.backward(a); });
  };

  const int64_t per_gpu = settings.bench_seqlen_per_gpu;
  // One GPU alone with per_gpu tokens (every rank measures its own; rank 0 reports).
  const CaseSpec alone = spec_for(per_gpu);
  const Times one = time_attention(alone, 20);
  // What the ring's tiles cost without communication: a rank's tiles are its local causal
  // triangle (the call above) and cp - 1 tiles of per_gpu x per_gpu / 2 pairs without a mask
  // or a sink (both orientations have the same work; the one timed is q per_gpu, kv half).
  CaseSpec half = spec_for(per_gpu);
  half.seqlen_kv = per_gpu / 2;
  half.config.mask_type = MaskType::kNoMask;
  half.config.softmax_type = SoftmaxType::kVanilla;
  const Times half_tile = time_attention(half, 20);

  // cp ranks with per_gpu tokens each (p2p): the device ring (through the NCCL communicator),
  // and with DPA_NCCL_TEST_CP_BENCH_STAGED=1 also the general algorithm through the host-staged
  // communicator (3 runs: it is slow).
  const CaseSpec together = spec_for(per_gpu * cp);
  const CaseTensors t = test::make_case(together);
  ThdCpPartition part;
  auto shard = [&](const HostTensor& full) {
    HostTensor local(full.dtype(), test::cp_local_shape(full.shape(), Format::kBSHD, cp, part));
    shard_sequence(full.view(), local.view(), Format::kBSHD, cp, env.rank);
    return local;
  };
  const HostTensor q = shard(t.q), k = shard(t.k), v = shard(t.v), d_o = shard(t.d_o);
  CpConfig cp_config;
  cp_config.comm_type = CpCommType::kP2P;
  DeviceCall together_call(together, t, q, k, v, d_o, lse_shape_of(together, per_gpu), device);
  auto run_cp = [&](Communicator& through, int runs, const CpConfig& with) {
    ContextParallelAttention attention(together.config, with, through);
    return time_call(
        together_call, runs, [&](const ForwardArgs& a) { return attention.forward(a); },
        [&](const BackwardArgs& a) { attention.backward(a); });
  };
  const std::string ring_refusal =
      cp::device_ring_refusal(together.config, cp_config, device_shaped(t, q, k, v), 0.0);
  const Times ring = run_cp(*nccl, 20, cp_config);
  // The other comm types over the same NCCL communicator: the device-resident general
  // algorithms (docs/context_parallel.md). a2a needs H = 16 to be a multiple of cp; a2a_p2p
  // takes groups of 2 from 4 ranks on.
  struct General {
    std::string name;
    CpConfig config;
    Times times;
  };
  std::vector<General> general;
  auto add_general = [&](const std::string& name, CpCommType type, int group) {
    CpConfig with;
    with.comm_type = type;
    with.a2a_group_size = group;
    general.push_back({name, with, run_cp(*nccl, 10, with)});
  };
  add_general("all_gather", CpCommType::kAllGather, 0);
  if (together.heads_q % cp == 0) add_general("a2a", CpCommType::kA2A, 0);
  if (cp >= 4 && cp % 2 == 0 && together.heads_q % 2 == 0)
    add_general("a2a_p2p (groups of 2)", CpCommType::kA2AP2P, 2);
  // One ring transfer of the backward's fp32 dK and dV (what the last step cannot hide).
  const size_t dkv_bytes = size_t(2 * per_gpu * together.heads_kv * together.head_dim_qk) * 4;
  DeviceTensor send_buffer(DType::kFloat32, {int64_t(dkv_bytes / 4)}, device);
  DeviceTensor recv_buffer(DType::kFloat32, {int64_t(dkv_bytes / 4)}, device);
  const double transfer_s = median_seconds(10, [&] {
    const int next = (env.rank + 1) % cp, previous = (env.rank + cp - 1) % cp;
    CommHandle sent = nccl->send(send_buffer.view().data, dkv_bytes, next, 0);
    CommHandle received = nccl->recv(recv_buffer.view().data, dkv_bytes, previous, 0);
    sent->wait();
    received->wait();
  });
  const bool with_staged = settings.bench_staged;
  const Times staged = with_staged ? run_cp(*comm, 3, cp_config) : Times{};
  if (env.rank == 0) {
    const double one_fwd = flops(alone, false) / one.forward * 1e-12;
    const double one_all = flops(alone, true) / one.forward_backward * 1e-12;
    // Per-GPU TFLOP/s of the cp-rank run and its share of the cp = 1 rate.
    auto report = [&](const std::string& what, double forward_s, double forward_backward_s) {
      const double fwd = flops(together, false) / forward_s / cp * 1e-12;
      const double all = flops(together, true) / forward_backward_s / cp * 1e-12;
      std::printf(
          "dpa_nccl_tests: cp scaling (causal, softcap 50, learnable sink, bf16, H=16, "
          "d=128, %lld tokens per GPU, %s): forward cp=1 %.1f, cp=%d %.1f TFLOP/s per GPU "
          "(%.1f%% of ideal); forward+backward cp=1 %.1f, cp=%d %.1f TFLOP/s per GPU (%.1f%% of "
          "ideal)\n",
          static_cast<long long>(per_gpu), what.c_str(), one_fwd, cp, fwd, 100.0 * fwd / one_fwd,
          one_all, cp, all, 100.0 * all / one_all);
    };
    report(ring_refusal.empty() ? "device ring" : "general p2p: " + ring_refusal, ring.forward,
           ring.forward_backward);
    for (const General& g : general)
      report(g.name + ", device-resident general algorithm, median of 10", g.times.forward,
             g.times.forward_backward);
    report("the ring's tiles alone on one GPU, no communication or merges",
           one.forward + (cp - 1) * half_tile.forward,
           one.forward_backward + (cp - 1) * half_tile.forward_backward);
    if (with_staged)
      report("host-staged communicator, median of 3", staged.forward, staged.forward_backward);
    std::printf(
        "dpa_nccl_tests: cp timings: ring forward %.2f ms, forward+backward %.2f ms; tiles alone "
        "%.2f / %.2f ms; one ring transfer of fp32 dK+dV (%.0f MB) %.2f ms (%.0f GB/s)\n",
        ring.forward * 1e3, ring.forward_backward * 1e3,
        (one.forward + (cp - 1) * half_tile.forward) * 1e3,
        (one.forward_backward + (cp - 1) * half_tile.forward_backward) * 1e3, dkv_bytes * 1e-6,
        transfer_s * 1e3, dkv_bytes / transfer_s * 1e-9);
    std::fflush(stdout);
  }
}

}  // namespace dpa::nccl_test
