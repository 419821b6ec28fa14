// The rendezvous that the in-process group's communicators share (include/dpa/cp.h,
// InProcessGroup): host messages and collective snapshots for the host communicators
// (in_process.cc), device transfers for the device communicators (in_process_device.cc), and the
// group's failure and deadline, common to both.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "dpa/cp.h"
#include "dpa/error.h"

namespace dpa {

namespace cp {

enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll };
const char* collective_name(CollectiveKind kind);
// Reductions sum float32 or float64 data; anything else is an error naming `dtype`.
void require_reducible(DType dtype);

inline Error in_process_error(const std::string& message) {
  return Error(ErrorCode::kBackendFailure, "communicator", message);
}

// One host collective: each rank's input snapshot, taken when it posts.
struct HostCollectiveSlot {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  size_t bytes = 0;  // of each rank's snapshot
  std::vector<std::vector<char>> inputs;
  int posted = 0;
  int finished = 0;
};

// The device communicators' transfers (in_process_device.cc).
struct DeviceRendezvous;

// The device communicators of a group, for `rank` on `device` (every rank of a group on one
// device). Throws kNotSupported in a build without CUDA.
std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::shared_ptr<InProcessGroup::State> state, int rank, int device);

}  // namespace cp

struct InProcessGroup::State {
  int size = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex mutex;
  std::condition_variable changed;
  bool failed = false;
  std::string failure;
  // Host communicators: messages by (src, dst, tag), collectives by sequence number.
  std::map<std::tuple<int, int, int>, std::deque<std::vector<char>>> mailboxes;
  std::map<uint64_t, cp::HostCollectiveSlot> slots;
  // Device communicators: created with the first one.
  std::shared_ptr<cp::DeviceRendezvous> device;

  // Waits (lock held) until `ready` or failure; a timeout fails the group.
  template <typename Ready>
  void wait(std::unique_lock<std::mutex>& lock, Ready ready, const std::string& what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!failed && !ready()) {
      if (changed.wait_until(lock, deadline) == std::cv_status::timeout && !failed && !ready()) {
        fail_locked("timed out after " + std::to_string(timeout.count()) + " ms waiting for " +
                    what);
      }
    }
    if (failed) throw cp::in_process_error("in-process group failed: " + failure);
  }
  void fail_locked(const std::string& reason) {
    if (!failed) {
      failed = true;
      failure = reason;
    }
    changed.notify_all();
  }
};

}  // namespace dpa
