// The device-resident CP calls of one ContextParallelAttention that the host has not waited
// for. Such a call returns once its work is enqueued on the caller's stream, as a single-GPU
// call does: every transfer is settled onto that stream (Transfers), so nothing there needs the
// host. What the host still owes each transfer is its wait(), where a failed or timed-out peer
// surfaces as an error naming the operation (and where the in-process device communicators
// release the operation). Those waits move to later calls: each call first waits for the calls
// whose work the device has finished (at once: they are complete), and blocks only on the oldest
// when more than kMaxCalls are outstanding, or on a call still unfinished `stale_after` after it
// returned (a peer that died or never posted: its transfers' waits then throw at their deadline,
// rather than the stream waiting for ever while the host runs on).
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

#include "cp/comm_requests.h"
#include "cp/cp_layout.h"

namespace dpa::cp {

// Where a call's work ends on its stream.
class CallEnd {
 public:
  virtual ~CallEnd() = default;
  // Whether the device has run past the end (never blocks).
  virtual bool reached() = 0;
  // Work enqueued on `stream` from now on runs after the end.
  virtual void order(void* stream) = 0;
  // Blocks until the device has run past the end.
  virtual void wait() = 0;
};

// The end of the work enqueued on `where`'s stream so far (a CUDA event).
std::unique_ptr<CallEnd> end_of_stream(const Placement& where);

class CallsInFlight {
 public:
  // Outstanding calls past which a new call waits on the host for the oldest.
  static constexpr size_t kMaxCalls = 8;

  explicit CallsInFlight(std::chrono::milliseconds stale_after = std::chrono::seconds(10))
      : stale_after_(stale_after) {}
  CallsInFlight(const CallsInFlight&) = delete;
  CallsInFlight& operator=(const CallsInFlight&) = delete;
  // Waits for every call's transfers; a failure is dropped (a destructor cannot report it:
  // wait() does).
  ~CallsInFlight();

  // Before a call that enqueues work on `stream`: orders that work after the previous call's
  // (which may have run on another stream and used the buffers this one reuses), then waits
  // for every call the device has finished, for the oldest ones beyond kMaxCalls - 1 and for
  // stale ones. The first failure among them throws, before the new call has touched anything.
  void begin(void* stream);
  // A call whose work is enqueued: `transfers` (settled onto its stream) are complete once
  // `end` is reached.
  void retire(std::unique_ptr<CallEnd> end, std::vector<CommHandle> transfers);
  // Waits on the host for every retired call, its transfers first (a failed or timed-out one
  // throws, after the call's other transfers have been waited for), then its end.
  void wait();
  size_t size() const { return calls_.size(); }

 private:
  using Clock = std::chrono::steady_clock;
  struct Call {
    std::unique_ptr<CallEnd> end;
    std::vector<CommHandle> transfers;
    Clock::time_point retired;
  };
  // Waits for the oldest call's transfers and drops it; rethrows the first failure after every
  // transfer. With `to_end`, then waits for its end too.
  void wait_oldest(bool to_end);

  std::chrono::milliseconds stale_after_;
  std::deque<Call> calls_;
};

// One CP call's place among the calls in flight. Constructed before the call enqueues anything
// (CallsInFlight::begin); finish() ends it with its transfers: device chunk sets over a device
// communicator, given `in_flight`, hand the settled transfers to it and return without
// waiting. Without `in_flight` (host sets, a host communicator's bounced view, which dies with
// the call, and the tests' direct calls) finish() waits for every transfer and, for device
// sets, for the stream. A call that throws after enqueuing work is retired with its end alone,
// so that the next call still orders its stream after that work.
class CallScope {
 public:
  CallScope(CallsInFlight* in_flight, const Placement& sets);
  ~CallScope();
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  void finish(Transfers& transfers);

 private:
  CallsInFlight* in_flight_;
  Placement sets_;
  bool finished_ = false;
};

}  // namespace dpa::cp
