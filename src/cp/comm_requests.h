// Helpers over Communicator handles shared by the communicators and every CP algorithm
// (cp_attention.cc and the device ring), so that neither includes the other.
#pragma once

#include <chrono>
#include <utility>
#include <vector>

#include "dpa/cp.h"

namespace dpa::cp {

// Waits for every handle, then empties the list.
void wait_all(std::vector<CommHandle>& handles);

// The transfers of one CP call. settle() makes a set of them usable by the work enqueued next
// on `stream`: with device buffers over a device communicator by ordering that stream after
// them (CommRequest::wait_on_stream: no host waits for the data), otherwise by waiting on the
// host at once. finish() waits on the host for everything settled (failures and deadlines
// surface there); a call does so before it returns. A buffer released by a stream-ordered free
// on `stream` after its transfers were settled is freed after them.
class Transfers {
 public:
  Transfers(Communicator& comm, bool device_buffers, void* stream);
  void settle(std::vector<CommHandle>& handles);
  void finish();
  // Whether settle() orders the stream (device buffers over a device communicator).
  bool on_stream() const { return on_stream_; }
  // The settled transfers, for a caller that waits for them later (CallsInFlight).
  std::vector<CommHandle> take_settled() { return std::move(settled_); }

 private:
  void* stream_ = nullptr;
  bool on_stream_ = false;
  std::vector<CommHandle> settled_;
};

// The handle of an operation with nothing to do (zero bytes), done at once.
class DoneRequest final : public CommRequest {
 public:
  void wait() override {}
};

// Pauses between polls of an operation: often at first (short operations finish in
// microseconds), then backing off to 1 ms so that a long wait does not burn a core.
class Backoff {
 public:
  void pause();

 private:
  int polls_ = 0;
  std::chrono::microseconds sleep_{20};
};

}  // namespace dpa::cp
