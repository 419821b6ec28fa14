// A device-resident CP call returns once its work is enqueued, as a single-GPU call does
// (include/dpa/cp.h, ContextParallelAttention; cp/calls_in_flight.h): with each virtual rank's
// stream held by a host function until every rank's forward and backward have returned, the
// calls must return (a host wait anywhere in them would hold them until the hold times out),
// and once released the outputs must equal, bit for bit, those of the same calls run with the
// stream free (deterministic mode), although the held run's inputs arrive on its stream after
// the hold, its workspace was last written from other inputs, and its backward runs on a second
// stream that only the object orders after the forward. The device ring (p2p) and the general
// algorithms (all_gather, a2a) each.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "dpa/cp.h"
#include "gpu/device_case.h"
#include "support/attention_case.h"
#include "support/cp_case.h"
#include "support/device_tensor.h"
#include "support/host_tensor.h"

namespace dpa::test {
namespace {

constexpr int kRanks = 2;
// Far above what enqueuing the calls takes; a call that waits for its stream returns only then.
constexpr auto kHoldLimit = std::chrono::seconds(10);

// Holds a stream until every rank has returned from its calls, or until kHoldLimit.
struct Hold {
  std::atomic<int> returned{0};
  std::atomic<bool> timed_out{false};

  static void CUDART_CB run(void* self) {
    Hold& hold = *static_cast<Hold*>(self);
    const auto deadline = std::chrono::steady_clock::now() + kHoldLimit;
    while (hold.returned.load() < kRanks) {
      if (std::chrono::steady_clock::now() > deadline) {
        hold.timed_out = true;
        return;
      }
      std::this_thread::yield();
    }
  }
};

struct AsyncCase {
  std::string name;
  CpCommType type;
  CaseSpec spec;
};

std::vector<AsyncCase> async_cases() {
  CaseSpec s;
  s.dtype = DType::kBFloat16;
  s.batch = 2;
  s.seqlen_q = s.seqlen_kv = 256;
  s.heads_q = 4;
  s.heads_kv = 2;
  s.head_dim_qk = s.head_dim_v = 64;
  s.config.mask_type = MaskType::kCausal;
  s.config.softmax_type = SoftmaxType::kLearnable;  // dalpha, reduced over the ranks below
  s.config.deterministic = true;                    // bit-identical run to run
  CaseSpec window = s;
  window.config.window_left = 47;
  window.config.window_right = 0;
  return {{"p2p_device_ring", CpCommType::kP2P, s},
          {"all_gather_window", CpCommType::kAllGather, window},
          {"a2a", CpCommType::kA2A, s}};
}

// One rank's outputs, downloaded.
struct RankOutputs {
  std::vector<HostTensor> tensors;  // o, lse, dq, dk, dv, dalpha
};

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  const size_t bytes = size_t(a.numel()) * dtype_size(a.dtype());
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.view().data, b.view().data, bytes) == 0;
}

class GpuCpAsync : public ::testing::TestWithParam<AsyncCase> {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    if (reference_only_mode()) GTEST_SKIP() << "reference-only mode: no GPU run";
  }
};

// dst <- src on `stream` (device to device: never a host wait).
void copy_on_stream(const DeviceTensor& dst, const DeviceTensor& src, cudaStream_t stream) {
  const TensorView& d = dst.view();
  ASSERT_EQ(cudaMemcpyAsync(d.data, src.view().data, size_t(d.numel()) * dtype_size(d.dtype),
                            cudaMemcpyDeviceToDevice, stream),
            cudaSuccess);
}

TEST_P(GpuCpAsync, ReturnsBeforeItsStreamRunsAndMatchesTheSynchronousRun) {
  const AsyncCase& c = GetParam();
  const CaseSpec& spec = c.spec;
  CaseSpec other_spec = spec;
  other_spec.seed += 1;
  // The held run computes on inputs B that reach its tensors only when its stream runs, after
  // its workspace was last written from inputs A, so that work not ordered after the copies
  // (a transfer reading the inputs early, a workspace read too soon) shows up as A's bits.
  const CaseTensors a = make_case(spec), b = make_case(other_spec);
  const Format format = spec.config.format;
  CpConfig cp_config;
  cp_config.comm_type = c.type;
  cp_config.reduce_dalpha = true;
  Hold hold;
  std::vector<RankOutputs> free_run(kRanks), held_run(kRanks);

  run_in_process_on_device(
      kRanks, 0,
      [&](int rank, DeviceCommunicator& comm) {
        auto shard = [&](const HostTensor& full) {
          HostTensor local(full.dtype(), cp_local_shape(full.shape(), format, kRanks, {}));
          shard_sequence(full.view(), local.view(), format, kRanks, rank);
          return DeviceTensor(local, 0);
        };
        const DeviceTensor a_q = shard(a.q), a_k = shard(a.k), a_v = shard(a.v),
                           a_do = shard(a.d_o);
        const DeviceTensor b_q = shard(b.q), b_k = shard(b.k), b_v = shard(b.v),
                           b_do = shard(b.d_o);
        const DeviceTensor offsets(b.softmax_offset, 0);
        auto local = [&](const HostTensor& full) {
          return DeviceTensor(spec.dtype, cp_local_shape(full.shape(), format, kRanks, {}), 0);
        };
        DeviceTensor q = local(a.q), k = local(a.k), v = local(a.v), d_o = local(a.d_o);
        DeviceTensor o = local(a.d_o), dq = local(a.q), dk = local(a.k), dv = local(a.v);
        DeviceTensor lse(DType::kFloat32, {spec.batch, spec.heads_q, spec.seqlen_q / kRanks}, 0);
        DeviceTensor dalpha(DType::kFloat32, {spec.heads_q}, 0);
        cudaStream_t forward_stream = nullptr, backward_stream = nullptr;
        ASSERT_EQ(cudaStreamCreateWithFlags(&forward_stream, cudaStreamNonBlocking), cudaSuccess);
        ASSERT_EQ(cudaStreamCreateWithFlags(&backward_stream, cudaStreamNonBlocking), cudaSuccess);
        auto inputs_from = [&](const DeviceTensor& sq, const DeviceTensor& sk,
                               const DeviceTensor& sv, const DeviceTensor& sdo,
                               cudaStream_t stream) {
          copy_on_stream(q, sq, stream);
          copy_on_stream(k, sk, stream);
          copy_on_stream(v, sv, stream);
          copy_on_stream(d_o, sdo, stream);
        };
        auto settle = [&] {
          ASSERT_EQ(cudaStreamSynchronize(forward_stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(backward_stream), cudaSuccess);
        };
        // The backward on `backward_stream`: the object orders it after the forward's end.
        auto run_calls = [&](ContextParallelAttention& attention, cudaStream_t backward_on) {
          ForwardArgs fwd;
          fwd.in.q = q.view();
          fwd.in.k = k.view();
          fwd.in.v = v.view();
          fwd.in.softmax_offset = offsets.view();
          fwd.o = o.view();
          fwd.lse = lse.view();
          fwd.stream = forward_stream;
          attention.forward(fwd);
          BackwardArgs bwd;
          bwd.in = fwd.in;
          bwd.o = o.view();
          bwd.lse = lse.view();
          bwd.d_o = d_o.view();
          bwd.dq = dq.view();
          bwd.dk = dk.view();
          bwd.dv = dv.view();
          bwd.dsoftmax_offset = dalpha.view();
          bwd.stream = backward_on;
          attention.backward(bwd);
        };
        auto outputs = [&] {
          RankOutputs r;
          for (const DeviceTensor* out : {&o, &lse, &dq, &dk, &dv, &dalpha})
            r.tensors.push_back(out->download(backward_stream));
          return r;
        };

        // Free: inputs B, one stream; the outputs to compare with.
        {
          ContextParallelAttention attention(spec.config, cp_config, comm);
          inputs_from(b_q, b_k, b_v, b_do, forward_stream);
          run_calls(attention, forward_stream);
          attention.synchronize();
          settle();
          free_run[size_t(rank)] = outputs();
        }

        ContextParallelAttention attention(spec.config, cp_config, comm);
        // Warm: inputs A, the backward on its own stream; its workspace is sized and written.
        inputs_from(a_q, a_k, a_v, a_do, forward_stream);
        run_calls(attention, backward_stream);
        attention.synchronize();
        settle();

        // Held: nothing on the forward's stream runs (and so nothing on the backward's, ordered
        // after it) until every rank has returned from both calls; inputs B arrive on it first.
        for (DeviceTensor* out : {&o, &lse, &dq, &dk, &dv, &dalpha}) out->poison(forward_stream);
        settle();
        ASSERT_EQ(cudaLaunchHostFunc(forward_stream, &Hold::run, &hold), cudaSuccess);
        inputs_from(b_q, b_k, b_v, b_do, forward_stream);
        run_calls(attention, backward_stream);
        ++hold.returned;
        attention.synchronize();
        settle();
        held_run[size_t(rank)] = outputs();
        ASSERT_EQ(cudaStreamDestroy(forward_stream), cudaSuccess);
        ASSERT_EQ(cudaStreamDestroy(backward_stream), cudaSuccess);
      },
      std::chrono::milliseconds(30000));

  EXPECT_FALSE(hold.timed_out.load())
      << c.name << ": a call returned only after its stream was released: it waited on the host";
  const char* names[] = {"o", "lse", "dq", "dk", "dv", "dalpha"};
  for (int rank = 0; rank < kRanks; ++rank)
    for (size_t i = 0; i < free_run[size_t(rank)].tensors.size(); ++i)
      EXPECT_TRUE(same_bytes(free_run[size_t(rank)].tensors[i], held_run[size_t(rank)].tensors[i]))
          << c.name << ", rank " << rank << ": " << names[i]
          << " differs from the run with its stream free";
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuCpAsync, ::testing::ValuesIn(async_cases()),
                         [](const ::testing::TestParamInfo<AsyncCase>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace dpa::test
