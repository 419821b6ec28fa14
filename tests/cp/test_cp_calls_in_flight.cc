// The bookkeeping of CP calls that return before their transfers are waited for
// (cp/calls_in_flight.h), with scripted call ends and transfers; the GPU suite runs the real
// thing (GpuCpAsync in tests/gpu/test_gpu_cp_async.cc).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cp/calls_in_flight.h"
#include "dpa/error.h"

namespace dpa::cp {
namespace {

// What the host did, in order.
using Log = std::vector<std::string>;

class ScriptedEnd final : public CallEnd {
 public:
  ScriptedEnd(std::string name, bool* reached, Log* log)
      : name_(std::move(name)), reached_(reached), log_(log) {}
  bool reached() override { return *reached_; }
  void order(void* stream) override {
    std::string line = "order ";
    line += static_cast<const char*>(stream);
    line += " after ";
    line += name_;
    log_->push_back(line);
  }
  void wait() override { log_->push_back("wait end " + name_); }

 private:
  std::string name_;
  bool* reached_;
  Log* log_;
};

class ScriptedTransfer final : public CommRequest {
 public:
  ScriptedTransfer(std::string name, bool fails, Log* log)
      : name_(std::move(name)), fails_(fails), log_(log) {}
  void wait() override {
    log_->push_back("wait " + name_);
    if (fails_) throw Error(ErrorCode::kBackendFailure, "communicator", name_ + " failed");
  }

 private:
  std::string name_;
  bool fails_;
  Log* log_;
};

class CallsInFlightTest : public ::testing::Test {
 protected:
  // A call named `name` with one transfer per entry of `fails` (name.0, name.1, ...).
  void retire(CallsInFlight& calls, const std::string& name, std::vector<bool> fails = {false}) {
    reached_.push_back(std::make_unique<bool>(false));
    std::vector<CommHandle> transfers;
    for (size_t i = 0; i < fails.size(); ++i)
      transfers.push_back(
          std::make_unique<ScriptedTransfer>(name + "." + std::to_string(i), fails[i], &log_));
    calls.retire(std::make_unique<ScriptedEnd>(name, reached_.back().get(), &log_),
                 std::move(transfers));
  }
  void reach(size_t call) { *reached_[call] = true; }

  Log log_;
  std::vector<std::unique_ptr<bool>> reached_;
  char stream_[2] = "s";
};

TEST_F(CallsInFlightTest, RetiringWaitsForNothing) {
  CallsInFlight calls;
  retire(calls, "a", {false, false});
  EXPECT_TRUE(log_.empty());
  EXPECT_EQ(calls.size(), 1u);
  calls.wait();
  EXPECT_EQ(log_, (Log{"wait a.0", "wait a.1", "wait end a"}));
  EXPECT_EQ(calls.size(), 0u);
}

TEST_F(CallsInFlightTest, BeginOrdersAfterTheLastCallAndWaitsOnlyForFinishedOnes) {
  CallsInFlight calls;
  calls.begin(stream_);  // nothing in flight: nothing to order
  EXPECT_TRUE(log_.empty());
  retire(calls, "a");
  retire(calls, "b");
  retire(calls, "c");
  reach(0);
  reach(2);  // c has ended but b has not: calls are waited for in order
  calls.begin(stream_);
  EXPECT_EQ(log_, (Log{"order s after c", "wait a.0"}));
  EXPECT_EQ(calls.size(), 2u);
  reach(1);
  log_.clear();
  calls.begin(stream_);
  EXPECT_EQ(log_, (Log{"order s after c", "wait b.0", "wait c.0"}));
  EXPECT_EQ(calls.size(), 0u);
}

TEST_F(CallsInFlightTest, BeginBlocksOnTheOldestBeyondTheBound) {
  CallsInFlight calls;
  for (size_t i = 0; i < CallsInFlight::kMaxCalls; ++i) retire(calls, std::to_string(i));
  calls.begin(stream_);  // none has ended; the oldest makes room for the next call
  std::string order = "order s after ";
  order += std::to_string(CallsInFlight::kMaxCalls - 1);
  EXPECT_EQ(log_, (Log{order, "wait 0.0"}));
  EXPECT_EQ(calls.size(), CallsInFlight::kMaxCalls - 1);
}

TEST_F(CallsInFlightTest, BeginWaitsForACallStillUnfinishedLongAfterItReturned) {
  CallsInFlight calls(std::chrono::milliseconds(0));  // every unfinished call is stale at once
  retire(calls, "a");
  calls.begin(stream_);  // a has not ended, but it is stale: its transfers' deadlines apply
  EXPECT_EQ(log_, (Log{"order s after a", "wait a.0"}));
  EXPECT_EQ(calls.size(), 0u);
}

TEST_F(CallsInFlightTest, AFailedTransferThrowsAtTheNextCallAfterItsCallsOtherTransfers) {
  CallsInFlight calls;
  retire(calls, "a", {true, false});
  retire(calls, "b");
  reach(0);
  try {
    calls.begin(stream_);
    FAIL() << "a failed transfer was not reported";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kBackendFailure);
    EXPECT_NE(std::string(error.what()).find("a.0 failed"), std::string::npos) << error.what();
  }
  EXPECT_EQ(log_, (Log{"order s after b", "wait a.0", "wait a.1"}));
  EXPECT_EQ(calls.size(), 1u);  // b is still in flight
  log_.clear();
  calls.wait();
  EXPECT_EQ(log_, (Log{"wait b.0", "wait end b"}));
}

TEST_F(CallsInFlightTest, SynchronizeReportsAFailureWithoutWaitingForThatCallsEnd) {
  CallsInFlight calls;
  retire(calls, "a", {false, true});
  EXPECT_THROW(calls.wait(), Error);
  EXPECT_EQ(log_, (Log{"wait a.0", "wait a.1"}));
  EXPECT_EQ(calls.size(), 0u);
}

TEST_F(CallsInFlightTest, DestructionWaitsForEveryTransferAndSwallowsFailures) {
  {
    CallsInFlight calls;
    retire(calls, "a", {true});
    retire(calls, "b");
  }
  EXPECT_EQ(log_, (Log{"wait a.0", "wait b.0"}));
}

}  // namespace
}  // namespace dpa::cp
