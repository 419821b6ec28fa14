// Helpers over Communicator handles shared by the communicators and every CP algorithm
// (cp_attention.cc and the device ring), so that neither includes the other.
#pragma once

#include <chrono>
#include <vector>

#include "dpa/cp.h"

namespace dpa::cp {

// Waits for every handle, then empties the list.
void wait_all(std::vector<CommHandle>& handles);

// Orders `stream` after every handle (CommRequest::wait_on_stream), then moves them to
// `waited_later`, which the caller waits on (wait_all) before it releases their buffers.
void order_stream_after(std::vector<CommHandle>& handles, void* stream,
                        std::vector<CommHandle>& waited_later);

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
