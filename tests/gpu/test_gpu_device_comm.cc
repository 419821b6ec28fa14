// Device communicators (include/dpa/cp.h): the in-process group's, where virtual ranks on one
// GPU exchange device buffers by device copies under NCCL's rules (unbuffered sends), so the
// device CP algorithms can be tested on one GPU; and make_host_bounced_communicator over any
// host communicator.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dpa/cp.h"
#include "dpa/error.h"
#include "gpu/device_case.h"
#include "support/device_tensor.h"
#include "support/forwarding_communicator.h"
#include "support/host_tensor.h"

namespace dpa::test {
namespace {

constexpr int kRanks = 4;
constexpr int64_t kCount = 6;  // fp32 values per rank block

class GpuDeviceComm : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!gpu_present(&why)) GTEST_SKIP() << why;
    if (reference_only_mode()) GTEST_SKIP() << "reference-only mode: no GPU run";
  }
};

// A device tensor of `blocks` blocks of kCount fp32 values, value(block, i) in each.
template <typename Value>
DeviceTensor filled(int64_t blocks, Value value) {
  HostTensor host(DType::kFloat32, {blocks * kCount});
  float* data = static_cast<float*>(host.view().data);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < kCount; ++i) data[b * kCount + i] = value(b, i);
  return DeviceTensor(host, 0);
}

std::vector<float> values(const DeviceTensor& t) {
  const HostTensor host = t.download();
  const float* data = static_cast<const float*>(host.view().data);
  return std::vector<float>(data, data + host.numel());
}

TEST_F(GpuDeviceComm, RingAndCollectivesMoveDeviceBuffers) {
  run_in_process_on_device(kRanks, 0, [](int rank, DeviceCommunicator& comm) {
    EXPECT_EQ(comm.device(), 0);
    EXPECT_TRUE(comm.healthy());
    const int next = (rank + 1) % kRanks, previous = (rank + kRanks - 1) % kRanks;
    auto mine = [rank](int64_t block, int64_t i) { return float(100 * rank + 10 * block + i); };

    // A ring: every rank posts its send and its receive before waiting on either (the sends
    // are not buffered: each completes when its receive is posted and the copy has run).
    const DeviceTensor out = filled(1, mine);
    DeviceTensor in(DType::kFloat32, {kCount}, 0);
    CommHandle sent = comm.send(out.view().data, kCount * sizeof(float), next, 3);
    CommHandle received = comm.recv(in.view().data, kCount * sizeof(float), previous, 3);
    sent->wait();
    received->wait();
    const std::vector<float> got = values(in);
    for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(got[size_t(i)], 100 * previous + i);

    // all_reduce in place: the sum over ranks.
    DeviceTensor sum = filled(1, mine);
    comm.all_reduce(sum.view().data, kCount, DType::kFloat32)->wait();
    const std::vector<float> summed = values(sum);
    for (int64_t i = 0; i < kCount; ++i)
      EXPECT_EQ(summed[size_t(i)], 100 * (0 + 1 + 2 + 3) + 4 * i);

    // all_gather: block r from rank r.
    DeviceTensor gathered(DType::kFloat32, {kRanks * kCount}, 0);
    comm.all_gather(out.view().data, gathered.view().data, kCount * sizeof(float))->wait();
    const std::vector<float> all = values(gathered);
    for (int r = 0; r < kRanks; ++r)
      for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(all[size_t(r * kCount + i)], 100 * r + i);

    // all_to_all: block r of my input goes to rank r; block s of my output is rank s's block
    // `rank`.
    const DeviceTensor blocks = filled(kRanks, mine);
    DeviceTensor exchanged(DType::kFloat32, {kRanks * kCount}, 0);
    comm.all_to_all(blocks.view().data, exchanged.view().data, kCount * sizeof(float))->wait();
    const std::vector<float> swapped = values(exchanged);
    for (int s = 0; s < kRanks; ++s)
      for (int64_t i = 0; i < kCount; ++i)
        EXPECT_EQ(swapped[size_t(s * kCount + i)], 100 * s + 10 * rank + i);

    // reduce_scatter: the sum over ranks of their block `rank`.
    DeviceTensor scattered(DType::kFloat32, {kCount}, 0);
    comm.reduce_scatter(blocks.view().data, scattered.view().data, kCount, DType::kFloat32)->wait();
    const std::vector<float> reduced = values(scattered);
    for (int64_t i = 0; i < kCount; ++i)
      EXPECT_EQ(reduced[size_t(i)], 100 * (0 + 1 + 2 + 3) + 4 * (10 * rank + i));
  });
}

TEST_F(GpuDeviceComm, ASendCompletesOnlyOnceItsReceiveIsPosted) {
  // Unbuffered, as over NCCL: rank 0's send cannot complete before rank 1 posts the receive,
  // which it does only after a pause. A buffered send (the host communicators') would return at
  // once and see the flag unset.
  std::atomic<bool> receive_posted{false};
  run_in_process_on_device(2, 0, [&](int rank, DeviceCommunicator& comm) {
    if (rank == 0) {
      const DeviceTensor out = filled(1, [](int64_t, int64_t i) { return float(7 + i); });
      comm.send(out.view().data, kCount * sizeof(float), 1, 0)->wait();
      EXPECT_TRUE(receive_posted.load());
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    DeviceTensor in(DType::kFloat32, {kCount}, 0);
    receive_posted = true;
    comm.recv(in.view().data, kCount * sizeof(float), 0, 0)->wait();
    const std::vector<float> got = values(in);
    for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(got[size_t(i)], 7 + i);
  });
}

TEST_F(GpuDeviceComm, AStreamOrderedWaitHoldsTheStreamNotTheHost) {
  // Rank 0's stream is held by a host function until rank 1 has checked that wait_on_stream
  // returned (bounded at 10 s), so the copy runs only after that: a wait_on_stream that waited
  // on the host for the data returns only once the hold is over (sender_released set). A copy
  // of the received buffer on the ordered stream must still see the data (without the ordering
  // it would read the poisoned buffer). Rank 1's buffers and stream are made before the ranks
  // start: allocating synchronizes the legacy stream, which waits for rank 0's held one.
  std::atomic<bool> receiver_checked{false}, sender_released{false};
  struct Hold {
    std::atomic<bool>* receiver_checked;
    std::atomic<bool>* released;
  } hold{&receiver_checked, &sender_released};
  DeviceTensor in(DType::kFloat32, {kCount}, 0);
  DeviceTensor copy(DType::kFloat32, {kCount}, 0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  run_in_process_on_device(2, 0, [&](int rank, DeviceCommunicator& comm) {
    if (rank == 0) {
      const DeviceTensor out = filled(1, [](int64_t, int64_t i) { return float(5 + i); });
      auto hold_stream = [](void* data) {
        const Hold* h = static_cast<const Hold*>(data);
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!h->receiver_checked->load() && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        h->released->store(true);
      };
      ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(comm.stream()), hold_stream, &hold),
                cudaSuccess);
      comm.send(out.view().data, kCount * sizeof(float), 1, 0)->wait();
      return;
    }
    CommHandle received = comm.recv(in.view().data, kCount * sizeof(float), 0, 0);
    received->wait_on_stream(stream);
    EXPECT_FALSE(sender_released.load()) << "wait_on_stream waited for the data on the host";
    receiver_checked = true;
    EXPECT_EQ(cudaMemcpyAsync(copy.view().data, in.view().data, kCount * sizeof(float),
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    received->wait();
  });
  cudaStreamDestroy(stream);
  const std::vector<float> got = values(copy);
  for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(got[size_t(i)], 5 + i);
}

TEST_F(GpuDeviceComm, AHandleDroppedUnwaitedFailsTheGroup) {
  // As over NCCL: rank 0 drops its send's handle without waiting (before rank 1 has posted the
  // receive, which it does only once the handle is gone), so the group fails and rank 1's
  // receive throws instead of copying from a buffer its owner may have released.
  std::atomic<bool> dropped{false};
  EXPECT_THROW(run_in_process_on_device(
                   2, 0,
                   [&](int rank, DeviceCommunicator& comm) {
                     if (rank == 0) {
                       const DeviceTensor out =
                           filled(1, [](int64_t, int64_t i) { return float(i); });
                       comm.send(out.view().data, kCount * sizeof(float), 1, 0);  // dropped
                       dropped = true;
                       return;
                     }
                     while (!dropped) std::this_thread::yield();
                     DeviceTensor in(DType::kFloat32, {kCount}, 0);
                     comm.recv(in.view().data, kCount * sizeof(float), 0, 0)->wait();
                   },
                   std::chrono::milliseconds(5000)),
               Error);
}

TEST_F(GpuDeviceComm, AReceiveMatchesTheNextSendByOrderNotByTag) {
  // NCCL matches a pair's operations in posting order and ignores tags: receives posted in
  // another tag order than the sends are an error here, not a match by tag that would pass on
  // one GPU and exchange the wrong buffers over NCCL.
  EXPECT_THROW(run_in_process_on_device(
                   2, 0,
                   [](int rank, DeviceCommunicator& comm) {
                     const DeviceTensor a = filled(1, [](int64_t, int64_t i) { return float(i); });
                     DeviceTensor in(DType::kFloat32, {kCount}, 0);
                     std::vector<CommHandle> handles;
                     if (rank == 0) {
                       handles.push_back(comm.send(a.view().data, kCount * sizeof(float), 1, 1));
                       handles.push_back(comm.send(a.view().data, kCount * sizeof(float), 1, 2));
                     } else {
                       handles.push_back(comm.recv(in.view().data, kCount * sizeof(float), 0, 2));
                       handles.push_back(comm.recv(in.view().data, kCount * sizeof(float), 0, 1));
                     }
                     for (CommHandle& handle : handles) handle->wait();
                   },
                   std::chrono::milliseconds(5000)),
               Error);
}

TEST_F(GpuDeviceComm, AHostBufferIsRefusedByName) {
  run_in_process_on_device(1, 0, [](int, DeviceCommunicator& comm) {
    std::vector<float> host(kCount, 1.0f);
    try {
      comm.send(host.data(), host.size() * sizeof(float), 0, 0);
      ADD_FAILURE() << "a host pointer was taken as device memory";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(error.argument(), "data");
    }
  });
}

TEST_F(GpuDeviceComm, ADeviceCommunicatorGetsNoBouncedView) {
  run_in_process_on_device(1, 0, [](int, DeviceCommunicator& comm) {
    try {
      make_host_bounced_communicator(comm, 0);
      ADD_FAILURE() << "a device communicator was bounced through the host";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_EQ(error.argument(), "host");
    }
  });
}

TEST_F(GpuDeviceComm, AFailingRankReleasesTheOthers) {
  // Rank 1 fails before sending; rank 0 waits for its message and must throw, not hang.
  EXPECT_THROW(
      run_in_process_on_device(2, 0,
                               [](int rank, DeviceCommunicator& comm) {
                                 DeviceTensor in(DType::kFloat32, {kCount}, 0);
                                 if (rank == 1)
                                   throw Error(ErrorCode::kInvalidArgument, "test", "fails");
                                 comm.recv(in.view().data, kCount * sizeof(float), 1, 0)->wait();
                               }),
      Error);
}

// A host communicator whose sends read their buffer only when waited on, as an unbuffered
// transport may: a bounced send must keep its host copy alive until then.
class DeferredSends final : public ForwardingCommunicator {
 public:
  using ForwardingCommunicator::ForwardingCommunicator;
  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    struct Deferred final : CommRequest {
      Communicator* inner = nullptr;
      const void* data = nullptr;
      size_t bytes = 0;
      int peer = 0, tag = 0;
      void wait() override {
        if (inner) inner->send(data, bytes, peer, tag)->wait();
        inner = nullptr;
      }
    };
    auto request = std::make_unique<Deferred>();
    request->inner = &inner();
    request->data = data;
    request->bytes = bytes;
    request->peer = peer;
    request->tag = tag;
    return request;
  }
};

TEST_F(GpuDeviceComm, ABouncedCommunicatorKeepsSendsAliveAndFailsAlone) {
  run_in_process(2, [](int rank, Communicator& host) {
    DeferredSends deferred(host);
    const std::unique_ptr<DeviceCommunicator> comm = make_host_bounced_communicator(deferred, 0);
    EXPECT_EQ(comm->device_communicator(), comm.get());
    EXPECT_EQ(comm->rank(), rank);
    const int peer = 1 - rank;
    const DeviceTensor out = filled(1, [rank](int64_t, int64_t i) { return float(10 * rank + i); });
    DeviceTensor in(DType::kFloat32, {kCount}, 0);
    CommHandle sent = comm->send(out.view().data, kCount * sizeof(float), peer, 5);
    CommHandle received = comm->recv(in.view().data, kCount * sizeof(float), peer, 5);
    sent->wait();  // only now does the deferred send read the bounced host copy
    received->wait();
    const std::vector<float> got = values(in);
    for (int64_t i = 0; i < kCount; ++i) EXPECT_EQ(got[size_t(i)], 10 * peer + i);

    // Every rank is done with the group before one aborts its own view.
    DeviceTensor sum = filled(1, [](int64_t, int64_t) { return 1.0f; });
    comm->all_reduce(sum.view().data, kCount, DType::kFloat32)->wait();
    EXPECT_EQ(values(sum)[0], 2.0f);
    comm->abort("test");
    EXPECT_FALSE(comm->healthy());
    EXPECT_THROW(comm->send(out.view().data, kCount * sizeof(float), peer, 6), Error);
  });
}

}  // namespace
}  // namespace dpa::test
