// Context parallelism: the in-process communicator and the sharding helpers.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <numeric>

#include "dpa/cp.h"
#include "support/host_tensor.h"

namespace dpa {
namespace {

using namespace std::chrono_literals;

TEST(CpComm, RingSendRecvDoesNotDeadlock) {
  for (int size : {1, 2, 5}) {
    std::vector<int> received(size_t(size), -1);
    run_in_process(size, [&](int rank, Communicator& comm) {
      int value = 100 + rank, got = -1;
      CommHandle s = comm.send(&value, sizeof value, (rank + 1) % size, 3);
      CommHandle r = comm.recv(&got, sizeof got, (rank - 1 + size) % size, 3);
      r->wait();
      s->wait();
      received[size_t(rank)] = got;
    });
    for (int rank = 0; rank < size; ++rank)
      EXPECT_EQ(received[size_t(rank)], 100 + (rank - 1 + size) % size);
  }
}

TEST(CpComm, Collectives) {
  const int size = 4;
  run_in_process(size, [&](int rank, Communicator& comm) {
    // all_reduce in place, fp32 and fp64.
    std::vector<float> f = {float(rank), 1.0f};
    comm.all_reduce(f.data(), 2, DType::kFloat32)->wait();
    EXPECT_EQ(f[0], 6.0f);
    EXPECT_EQ(f[1], 4.0f);
    std::vector<double> d = {double(rank) * 0.5};
    comm.all_reduce(d.data(), 1, DType::kFloat64)->wait();
    EXPECT_DOUBLE_EQ(d[0], 3.0);
    // all_gather.
    int mine = rank * 10;
    std::vector<int> all(static_cast<size_t>(size));
    comm.all_gather(&mine, all.data(), sizeof mine)->wait();
    for (int r = 0; r < size; ++r) EXPECT_EQ(all[size_t(r)], r * 10);
    // reduce_scatter: block b of every rank is (rank + b); rank r gets sum over ranks of (rank +
    // r).
    std::vector<float> blocks(static_cast<size_t>(size));
    for (int b = 0; b < size; ++b) blocks[size_t(b)] = float(rank + b);
    float out = -1;
    comm.reduce_scatter(blocks.data(), &out, 1, DType::kFloat32)->wait();
    EXPECT_EQ(out, float(6 + 4 * rank));
    // all_to_all: block b of rank r is 100 r + b; rank r receives 100 s + r from each s.
    std::vector<int> send(static_cast<size_t>(size)), recv(static_cast<size_t>(size));
    for (int b = 0; b < size; ++b) send[size_t(b)] = 100 * rank + b;
    comm.all_to_all(send.data(), recv.data(), sizeof(int))->wait();
    for (int s = 0; s < size; ++s) EXPECT_EQ(recv[size_t(s)], 100 * s + rank);
  });
}

TEST(CpComm, AsynchronousCollectivesCompleteOutOfPostingOrder) {
  run_in_process(3, [&](int rank, Communicator& comm) {
    float a = float(rank), b = 2.0f * float(rank);
    CommHandle first = comm.all_reduce(&a, 1, DType::kFloat32);
    CommHandle second = comm.all_reduce(&b, 1, DType::kFloat32);
    second->wait();
    first->wait();
    EXPECT_EQ(a, 3.0f);
    EXPECT_EQ(b, 6.0f);
  });
}

TEST(CpComm, MissingPeerTimesOutInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_in_process(
                   2,
                   [&](int rank, Communicator& comm) {
                     if (rank == 0) {
                       int value = 0;
                       comm.recv(&value, sizeof value, 1, 0)->wait();  // rank 1 never sends
                     }
                   },
                   200ms),
               Error);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

TEST(CpComm, AFailingRankReleasesTheOthers) {
  try {
    run_in_process(3, [&](int rank, Communicator& comm) {
      if (rank == 1) throw Error(ErrorCode::kInvalidArgument, "q", "bad shard on rank 1");
      float x = 1;
      comm.all_reduce(&x, 1, DType::kFloat32)->wait();  // never completes: rank 1 is gone
    });
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("bad shard on rank 1"), std::string::npos)
        << error.what();  // the root cause, not the other ranks' "aborted"
  }
}

TEST(CpComm, ADeviceCommunicatorOfAMissingRankIsRefusedByName) {
  // Checked before any CUDA call, so this holds with or without a GPU (the device
  // communicators themselves are tested on the GPU: tests/gpu/test_gpu_device_comm.cc).
  InProcessGroup group(2);
  try {
    group.device_communicator(2, 0);
    FAIL() << "rank 2 of a group of 2 was accepted";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(error.argument(), "rank");
  }
}

TEST(CpComm, ABouncedCommunicatorOfANegativeDeviceIsRefusedByName) {
  // Checked before any CUDA call; without CUDA there is no device view at all.
  InProcessGroup group(1);
  const std::unique_ptr<Communicator> host = group.communicator(0);
  try {
    make_host_bounced_communicator(*host, -1);
    FAIL() << "device -1 was accepted";
  } catch (const Error& error) {
#if defined(DPA_WITH_CUDA)
    EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
#else
    EXPECT_EQ(error.code(), ErrorCode::kNotSupported);
#endif
    EXPECT_EQ(error.argument(), "device");
  }
}

TEST(CpComm, MismatchedCollectivesAreAnError) {
  EXPECT_THROW(run_in_process(2,
                              [&](int rank, Communicator& comm) {
                                float x[2] = {0, 0};
                                comm.all_reduce(x, rank + 1, DType::kFloat32)->wait();
                              }),
               Error);
}

TEST(CpSharding, DualChunkPositions) {
  EXPECT_EQ(dual_chunk_positions(8, 2, 0), (std::vector<int64_t>{0, 1, 6, 7}));
  EXPECT_EQ(dual_chunk_positions(8, 2, 1), (std::vector<int64_t>{2, 3, 4, 5}));
  // Every position is held exactly once across ranks.
  for (int cp : {1, 2, 4, 8}) {
    std::vector<int> seen(size_t(16 * cp), 0);
    for (int r = 0; r < cp; ++r)
      for (int64_t p : dual_chunk_positions(16 * cp, cp, r)) ++seen[size_t(p)];
    for (int count : seen) EXPECT_EQ(count, 1);
  }
  EXPECT_THROW(dual_chunk_positions(10, 2, 0), Error);
}

TEST(CpSharding, ThdPartitionPadsEachSequence) {
  ThdCpPartition p = thd_cp_partition({5, 0, 8, 13}, 2);
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 5, 5, 13, 26}));
  EXPECT_EQ(p.cu_seqlens_padded, (std::vector<int32_t>{0, 8, 8, 16, 32}));
  EXPECT_EQ(p.local_cu_padded, (std::vector<int32_t>{0, 4, 4, 8, 16}));
}

TEST(CpSharding, ShardThenUnshardIsTheIdentity) {
  std::mt19937_64 rng(3);
  for (Format format : {Format::kBSHD, Format::kSBHD, Format::kTHD}) {
    for (int cp : {2, 4}) {
      ThdCpPartition part = thd_cp_partition({7, 16, 1}, cp);
      std::vector<int64_t> full_shape, local_shape;
      if (format == Format::kBSHD) full_shape = {2, 8 * cp, 3, 4}, local_shape = {2, 8, 3, 4};
      if (format == Format::kSBHD) full_shape = {8 * cp, 2, 3, 4}, local_shape = {8, 2, 3, 4};
      if (format == Format::kTHD)
        full_shape = {part.cu_seqlens_padded.back(), 3, 4},
        local_shape = {part.local_cu_padded.back(), 3, 4};
      test::HostTensor full = test::HostTensor::randn(DType::kFloat32, full_shape, rng);
      test::HostTensor back(DType::kFloat32, full_shape);
      back.fill(-99);
      for (int r = 0; r < cp; ++r) {
        test::HostTensor local(DType::kFloat32, local_shape);
        shard_sequence(full.view(), local.view(), format, cp, r, part.cu_seqlens_padded);
        unshard_sequence(local.view(), back.view(), format, cp, r, part.cu_seqlens_padded);
      }
      EXPECT_EQ(test::max_abs_error(back, full), 0.0) << to_string(format) << " cp " << cp;
    }
  }
}

TEST(CpSharding, CommTypeNames) {
  for (CpCommType t :
       {CpCommType::kP2P, CpCommType::kAllGather, CpCommType::kA2A, CpCommType::kA2AP2P})
    EXPECT_EQ(parse_cp_comm_type(to_string(t)), t);
  EXPECT_FALSE(parse_cp_comm_type("ring").has_value());
}

}  // namespace
}  // namespace dpa
