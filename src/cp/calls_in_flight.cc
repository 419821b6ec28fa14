#include "cp/calls_in_flight.h"

#include <exception>
#include <utility>

#include "cp/device_sets.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

namespace {

#if defined(DPA_WITH_CUDA)
class StreamEnd final : public CallEnd {
 public:
  explicit StreamEnd(const Placement& where) : point_(where.stream, where.index) {}
  bool reached() override { return point_.reached(); }
  void order(void* stream) override { point_.order(stream); }
  void wait() override { point_.wait(); }

 private:
  cuda::StreamPoint point_;
};
#endif

}  // namespace

std::unique_ptr<CallEnd> end_of_stream(const Placement& where) {
#if defined(DPA_WITH_CUDA)
  return std::make_unique<StreamEnd>(where);
#else
  (void)where;
  throw Error(ErrorCode::kNotSupported, "q", "CUDA tensors need a build with CUDA");
#endif
}

CallsInFlight::~CallsInFlight() {
  while (!calls_.empty()) {
    try {
      wait_oldest(false);
    } catch (...) {  // NOLINT(bugprone-empty-catch): reported by wait(), not by a destructor
    }
  }
}

void CallsInFlight::begin(void* stream) {
  if (calls_.empty()) return;
  // The previous call's end covers every earlier one: each call began after its predecessor.
  calls_.back().end->order(stream);
  while (!calls_.empty() &&
         (calls_.size() >= kMaxCalls || Clock::now() - calls_.front().retired >= stale_after_ ||
          calls_.front().end->reached()))
    wait_oldest(false);
}

void CallsInFlight::retire(std::unique_ptr<CallEnd> end, std::vector<CommHandle> transfers) {
  calls_.push_back({std::move(end), std::move(transfers), Clock::now()});
}

void CallsInFlight::wait() {
  while (!calls_.empty()) wait_oldest(true);
}

void CallsInFlight::wait_oldest(bool to_end) {
  Call call = std::move(calls_.front());
  calls_.pop_front();
  std::exception_ptr first;
  for (CommHandle& handle : call.transfers) {
    try {
      handle->wait();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  // After the transfers (whose waits have deadlines): the rest of its work is this device's.
  if (to_end) call.end->wait();
}

CallScope::CallScope(CallsInFlight* in_flight, const Placement& sets)
    : in_flight_(in_flight), sets_(sets) {
  if (in_flight_ != nullptr) in_flight_->begin(sets_.stream);
}

CallScope::~CallScope() {
  if (finished_ || in_flight_ == nullptr) return;
  try {
    in_flight_->retire(end_of_stream(sets_), {});
  } catch (...) {  // NOLINT(bugprone-empty-catch): the call's own error is on its way out
  }
}

void CallScope::finish(Transfers& transfers) {
  if (in_flight_ != nullptr && transfers.on_stream()) {
    // The end first: if recording it throws, the transfers are still Transfers' to handle.
    std::unique_ptr<CallEnd> end = end_of_stream(sets_);
    in_flight_->retire(std::move(end), transfers.take_settled());
    finished_ = true;
    return;
  }
  finished_ = true;
  transfers.finish();
  if (sets_.on_device()) synchronize(sets_);  // the outputs are in place, for any stream
}

}  // namespace dpa::cp
