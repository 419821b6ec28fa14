// The in-process communicator: N ranks as threads sharing one rendezvous (InProcessGroup;
// the device communicators over the same rendezvous are in_process_device.cc).
//
// Sends copy their bytes into the receiver's mailbox and complete at once, so a ring (every
// rank sends, then receives) cannot deadlock. Collectives snapshot each rank's input when it
// is posted; a rank's wait() blocks until every rank has posted, then computes its own output
// from the snapshots, so no rank ever reads another rank's live buffer (in-place all_reduce is
// safe). Every wait has a deadline: a timeout or an abort() fails the whole group, and every
// waiting rank wakes up and throws instead of hanging.
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "cp/comm_requests.h"
#include "cp/in_process_state.h"
#include "dpa/cp.h"
#include "dpa/error.h"

namespace dpa {

namespace cp {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

void require_reducible(DType dtype) {
  require(dtype == DType::kFloat32 || dtype == DType::kFloat64, "dtype",
          "reductions take float32 or float64 data");
}

}  // namespace cp

namespace {

using cp::collective_name;
using cp::CollectiveKind;

Error comm_error(const std::string& message) { return cp::in_process_error(message); }

template <typename T>
void add_into(void* out, const void* in, int64_t count) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(in);
  for (int64_t i = 0; i < count; ++i) o[i] += x[i];
}

using cp::DoneRequest;
using cp::require_reducible;
using State = InProcessGroup::State;

class RecvRequest final : public CommRequest {
 public:
  RecvRequest(std::shared_ptr<State> state, void* data, size_t bytes, int src, int dst, int tag)
      : state_(std::move(state)), data_(data), bytes_(bytes), key_(src, dst, tag) {}
  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(state_->mutex);
    auto& box = state_->mailboxes[key_];
    state_->wait(
        lock, [&] { return !box.empty(); },
        "a message from rank " + std::to_string(std::get<0>(key_)) + " to rank " +
            std::to_string(std::get<1>(key_)) + " (tag " + std::to_string(std::get<2>(key_)) + ")");
    std::vector<char> message = std::move(box.front());
    box.pop_front();
    lock.unlock();
    if (message.size() != bytes_) {
      std::lock_guard<std::mutex> relock(state_->mutex);
      state_->fail_locked("message size mismatch: sent " + std::to_string(message.size()) +
                          " bytes, receiver expects " + std::to_string(bytes_));
      throw comm_error(state_->failure);
    }
    if (bytes_) std::memcpy(data_, message.data(), bytes_);
    done_ = true;
  }

 private:
  std::shared_ptr<State> state_;
  void* data_;
  size_t bytes_;
  std::tuple<int, int, int> key_;
  bool done_ = false;
};

class CollectiveRequest final : public CommRequest {
 public:
  using Compute = std::function<void(const std::vector<std::vector<char>>&)>;
  CollectiveRequest(std::shared_ptr<State> state, uint64_t sequence, Compute compute)
      : state_(std::move(state)), sequence_(sequence), compute_(std::move(compute)) {}
  void wait() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(state_->mutex);
    cp::HostCollectiveSlot& slot = state_->slots[sequence_];
    state_->wait(
        lock, [&] { return slot.posted == state_->size; },
        std::string(collective_name(slot.kind)) + " #" + std::to_string(sequence_) +
            " (posted by " + std::to_string(slot.posted) + " of " + std::to_string(state_->size) +
            " ranks)");
    // Snapshots are never modified once every rank has posted: read them unlocked.
    lock.unlock();
    compute_(slot.inputs);
    lock.lock();
    if (++slot.finished == state_->size) state_->slots.erase(sequence_);
    done_ = true;
  }

 private:
  std::shared_ptr<State> state_;
  uint64_t sequence_;
  Compute compute_;
  bool done_ = false;
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<State> state, int rank)
      : state_(std::move(state)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return state_->size; }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    std::vector<char> message(bytes);
    if (bytes) std::memcpy(message.data(), data, bytes);
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failed) throw comm_error("in-process group failed: " + state_->failure);
    state_->mailboxes[{rank_, peer, tag}].push_back(std::move(message));
    state_->changed.notify_all();
    return std::make_unique<DoneRequest>();
  }

  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    return std::make_unique<RecvRequest>(state_, data, bytes, peer, rank_, tag);
  }

  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    require_reducible(dtype);
    const size_t bytes = size_t(count) * dtype_size(dtype);
    return post(CollectiveKind::kAllReduce, data, bytes,
                [=](const std::vector<std::vector<char>>& in) {
                  std::memset(data, 0, bytes);
                  for (const auto& block : in) reduce(data, block.data(), count, dtype);
                });
  }

  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    return post(CollectiveKind::kAllGather, send_data, bytes_per_rank,
                [=](const std::vector<std::vector<char>>& in) {
                  char* out = static_cast<char*>(recv_data);
                  for (size_t r = 0; r < in.size(); ++r)
                    if (bytes_per_rank)
                      std::memcpy(out + r * bytes_per_rank, in[r].data(), bytes_per_rank);
                });
  }

  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    require_reducible(dtype);
    const size_t block = size_t(count_per_rank) * dtype_size(dtype);
    const int me = rank_;
    return post(CollectiveKind::kReduceScatter, send_data, block * size_t(size()),
                [=](const std::vector<std::vector<char>>& in) {
                  std::memset(recv_data, 0, block);
                  for (const auto& snapshot : in)
                    reduce(recv_data, snapshot.data() + size_t(me) * block, count_per_rank, dtype);
                });
  }

  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    const int me = rank_;
    return post(CollectiveKind::kAllToAll, send_data, bytes_per_rank * size_t(size()),
                [=](const std::vector<std::vector<char>>& in) {
                  char* out = static_cast<char*>(recv_data);
                  for (size_t r = 0; r < in.size(); ++r)
                    if (bytes_per_rank)
                      std::memcpy(out + r * bytes_per_rank,
                                  in[r].data() + size_t(me) * bytes_per_rank, bytes_per_rank);
                });
  }

 private:
  static void reduce(void* out, const void* in, int64_t count, DType dtype) {
    if (dtype == DType::kFloat32)
      add_into<float>(out, in, count);
    else
      add_into<double>(out, in, count);
  }

  void check_peer(int peer) const {
    require(peer >= 0 && peer < size(), "peer", [&] {
      return "must be a rank in [0, " + std::to_string(size()) + "), got " + std::to_string(peer);
    });
  }

  CommHandle post(CollectiveKind kind, const void* input, size_t bytes,
                  CollectiveRequest::Compute compute) {
    const uint64_t sequence = next_collective_++;
    std::vector<char> snapshot(bytes);
    if (bytes) std::memcpy(snapshot.data(), input, bytes);
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failed) throw comm_error("in-process group failed: " + state_->failure);
    cp::HostCollectiveSlot& slot = state_->slots[sequence];
    if (slot.posted == 0) {
      slot.kind = kind;
      slot.bytes = bytes;
      slot.inputs.resize(size_t(state_->size));
    } else if (slot.kind != kind || slot.bytes != bytes) {
      state_->fail_locked("collective #" + std::to_string(sequence) + " mismatch: rank " +
                          std::to_string(rank_) + " posted " + collective_name(kind) + " of " +
                          std::to_string(bytes) + " bytes, another rank " +
                          collective_name(slot.kind) + " of " + std::to_string(slot.bytes));
      throw comm_error(state_->failure);
    }
    slot.inputs[size_t(rank_)] = std::move(snapshot);
    ++slot.posted;
    state_->changed.notify_all();
    return std::make_unique<CollectiveRequest>(state_, sequence, std::move(compute));
  }

  std::shared_ptr<State> state_;
  int rank_;
  uint64_t next_collective_ = 0;
};

}  // namespace

InProcessGroup::InProcessGroup(int size, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  require(size >= 1, "size", "an in-process group needs at least one rank");
  require(timeout.count() > 0, "timeout", "must be positive");
  state_->size = size;
  state_->timeout = timeout;
}

InProcessGroup::~InProcessGroup() = default;

int InProcessGroup::size() const { return state_->size; }

std::unique_ptr<Communicator> InProcessGroup::communicator(int rank) {
  require(rank >= 0 && rank < state_->size, "rank", [&] {
    return "must be in [0, " + std::to_string(state_->size) + "), got " + std::to_string(rank);
  });
  return std::make_unique<InProcessCommunicator>(state_, rank);
}

std::unique_ptr<DeviceCommunicator> InProcessGroup::device_communicator(int rank, int device) {
  require(rank >= 0 && rank < state_->size, "rank", [&] {
    return "must be in [0, " + std::to_string(state_->size) + "), got " + std::to_string(rank);
  });
  return cp::make_in_process_device_communicator(state_, rank, device);
}

void InProcessGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->fail_locked(reason);
}

namespace {

// Runs fn(rank, comm) on `size` threads over one group; the first exception aborts the group
// and is rethrown after every thread has finished.
template <typename Comm>
void run_ranks(int size, std::chrono::milliseconds timeout,
               const std::function<std::unique_ptr<Comm>(InProcessGroup&, int)>& make,
               const std::function<void(int, Comm&)>& fn) {
  InProcessGroup group(size, timeout);
  std::mutex first_mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank)
    threads.emplace_back([&, rank] {
      try {
        std::unique_ptr<Comm> comm = make(group, rank);
        fn(rank, *comm);
      } catch (const std::exception& error) {
        {
          std::lock_guard<std::mutex> lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        group.abort("rank " + std::to_string(rank) + " failed: " + error.what());
      } catch (...) {
        {
          std::lock_guard<std::mutex> lock(first_mutex);
          if (!first) first = std::current_exception();
        }
        group.abort("rank " + std::to_string(rank) + " failed");
      }
    });
  for (std::thread& thread : threads) thread.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace

void run_in_process(int size, const std::function<void(int, Communicator&)>& fn,
                    std::chrono::milliseconds timeout) {
  run_ranks<Communicator>(
      size, timeout, [](InProcessGroup& group, int rank) { return group.communicator(rank); }, fn);
}

void run_in_process_on_device(int size, int device,
                              const std::function<void(int, DeviceCommunicator&)>& fn,
                              std::chrono::milliseconds timeout) {
  run_ranks<DeviceCommunicator>(
      size, timeout,
      [device](InProcessGroup& group, int rank) { return group.device_communicator(rank, device); },
      fn);
}

}  // namespace dpa
