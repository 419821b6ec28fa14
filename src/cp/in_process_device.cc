// The in-process group's device communicators (include/dpa/cp.h,
// InProcessGroup::device_communicator): virtual ranks on one GPU that exchange through device
// copies, under NCCL's rules rather than the host communicators' buffering.
//
// A send and its receive form one transfer. Each side, when posted, records an event on its
// rank's stream (after the work ordered before the post); whichever rank posts second enqueues
// the copy on its own stream after the other side's event, so no host waits for a peer's data
// and no byte crosses host memory. wait() returns once the copy has completed: the data is then
// ready for any stream, and a send's buffer may be reused. wait_on_stream() waits on the host
// only until the copy is enqueued, then orders the caller's stream after its event. The rules are
// NCCL's (docs/nccl.md), so that the GPU suite checks them on one GPU: sends are not buffered
// (every send and receive of an exchange must be posted before any of them is waited on, or the
// wait times out), a pair's receives match its sends by order, not by tag (a tag or size that
// differs fails the group), zero-byte operations complete at once, and a handle destroyed before it
// was waited on fails the group. Not checked: that no point-to-point operation spans a collective,
// and the stream order NCCL's kernels impose (a send blocks its stream until received).
//
// A collective is run by the last rank to post it: every input is first copied into one scratch
// array on that rank's stream (so an in-place all_reduce reads no output), then every rank's
// output is written from it. Every wait has the group's deadline, and a failure, a mismatch or
// abort() fails the whole group. The ranks of a group's device communicators share one device.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "cp/comm_requests.h"
#include "cp/in_process_state.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/cp_ring_ops.h"
#include "cuda/runtime.h"
#endif

namespace dpa::cp {

#if defined(DPA_WITH_CUDA)

namespace {

using State = InProcessGroup::State;

std::string cuda_message(const std::string& what, cudaError_t error) {
  return what + ": " + cudaGetErrorName(error) + " " + cudaGetErrorString(error);
}

// Throws on a CUDA error after failing the group (the state's lock held), so that no other
// rank waits for this one until its deadline.
void check_locked(State& state, cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return;
  cudaGetLastError();  // clear it, so that a later launch check does not report it again
  const std::string message = "in-process device communicator: " + cuda_message(what, error);
  state.fail_locked(message);
  throw in_process_error(message);
}

// The same with the lock not held.
void check(State& state, cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return;
  std::lock_guard<std::mutex> lock(state.mutex);
  check_locked(state, error, what);
}

// A CUDA event owned by the transfer or collective that records it (an event destroyed before it
// completes is released when it does). Created without the state's lock held (a failure to
// create one fails the group, which takes the lock).
class Event {
 public:
  explicit Event(State& state) {
    check(state, cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating an event");
  }
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Polls `event` until it completes, failing the group on an error or after the group's timeout
// (a copy that never completes means a broken device, not a slow peer).
void wait_for_event(State& state, const Event& event, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + state.timeout;
  Backoff backoff;
  for (;;) {
    const cudaError_t status = cudaEventQuery(event.get());
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) check(state, status, "waiting for " + what);
    if (std::chrono::steady_clock::now() > deadline) {
      const std::string message = "in-process device communicator: " + what +
                                  " not complete after " + std::to_string(state.timeout.count()) +
                                  " ms";
      std::lock_guard<std::mutex> lock(state.mutex);
      state.fail_locked(message);
      throw in_process_error(message);
    }
    backoff.pause();
  }
}

// One side of a transfer or one rank's part of a collective, as posted: its buffer and an event
// after the work ordered before the post.
struct Side {
  const void* data = nullptr;
  size_t bytes = 0;
  std::shared_ptr<Event> ready;
  int tag = 0;
};

struct Transfer {
  Side send, recv;
  bool has_send = false, has_recv = false;
  std::shared_ptr<Event> done;  // recorded with the copy
  bool enqueued = false;        // the copy is on a stream (guarded by the state's mutex)
};

struct Collective {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  size_t bytes = 0;  // each rank's input
  int64_t count = 0;
  DType dtype = DType::kFloat32;
  std::vector<Side> inputs;
  std::vector<void*> outputs;
  int posted = 0, finished = 0;
  std::shared_ptr<Event> done;
  bool enqueued = false;
};

}  // namespace

// After a failure the group stays failed and every post checks that first, so what is left
// here then (emptied queues, collectives not every rank finished) is never read again.
struct DeviceRendezvous {
  int device = -1;
  // Transfers with one side posted, by (src, dst), oldest first (all of one side).
  std::map<std::pair<int, int>, std::deque<std::shared_ptr<Transfer>>> open;
  std::map<uint64_t, std::shared_ptr<Collective>> collectives;  // by sequence number
};

namespace {

// The handle of a transfer or a collective (`Operation`: its `enqueued` flag under the state's
// mutex, then its `done` event). A handle destroyed before it was waited on fails the group, as
// over NCCL: one whose operation is queued first waits for it (the copy still reads or writes
// the caller's buffers; a GPU that never finishes it hangs here, as it would anywhere), one
// still unmatched is first taken out of the rendezvous by `abandon_locked`, so that no peer
// copies to or from it later. `finished_locked` runs once wait() has seen it complete.
template <typename Operation>
class DeviceRequest final : public CommRequest {
 public:
  DeviceRequest(std::shared_ptr<State> state, std::shared_ptr<Operation> operation,
                std::string what, std::function<void()> abandon_locked,
                std::function<void()> finished_locked)
      : state_(std::move(state)),
        operation_(std::move(operation)),
        what_(std::move(what)),
        abandon_locked_(std::move(abandon_locked)),
        finished_locked_(std::move(finished_locked)) {}
  ~DeviceRequest() override {
    if (done_) return;
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (operation_->enqueued) {
      lock.unlock();
      cudaEventSynchronize(operation_->done->get());
      lock.lock();
    } else if (abandon_locked_) {
      abandon_locked_();
    }
    state_->fail_locked("a handle was destroyed before its operation (" + what_ + ") was waited");
  }
  DeviceRequest(const DeviceRequest&) = delete;
  DeviceRequest& operator=(const DeviceRequest&) = delete;

  void wait() override {
    if (done_) return;
    wait_enqueued();
    wait_for_event(*state_, *operation_->done, what_);
    if (finished_locked_) {
      std::lock_guard<std::mutex> lock(state_->mutex);
      finished_locked_();
    }
    done_ = true;
  }

  // The host waits for the peers to post (the copy or collective is then on a stream and its
  // `done` event recorded), not for the data.
  void wait_on_stream(void* stream) override {
    if (done_) return;
    // A null stream is the legacy stream of the group's device, not of the caller's current one.
    const cuda::DeviceGuard guard(wait_enqueued());
    check(*state_,
          cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), operation_->done->get(), 0),
          "ordering a stream after " + what_);
  }

 private:
  // Returns the group's device (read under the state's lock).
  int wait_enqueued() {
    std::unique_lock<std::mutex> lock(state_->mutex);
    state_->wait(
        lock, [&] { return operation_->enqueued; }, what_);
    return state_->device->device;
  }

  std::shared_ptr<State> state_;
  std::shared_ptr<Operation> operation_;
  std::string what_;
  std::function<void()> abandon_locked_, finished_locked_;
  bool done_ = false;
};

class InProcessDeviceCommunicator final : public DeviceCommunicator {
 public:
  InProcessDeviceCommunicator(std::shared_ptr<State> state, int rank, int device)
      : state_(std::move(state)), rank_(rank), device_(device) {
    require(device >= 0, "device",
            [&] { return "must be a CUDA device index, got " + std::to_string(device); });
    const cuda::DeviceGuard guard(device_);
    // A blocking stream: each operation comes after the legacy default stream's earlier work.
    check(*state_, cudaStreamCreate(&stream_), "creating its stream");
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->device) state_->device = std::make_shared<DeviceRendezvous>();
    if (state_->device->device < 0) state_->device->device = device;
    if (state_->device->device != device) {
      cudaStreamDestroy(stream_);
      require(false, "device", [&] {
        return "must be the device of the group's other device communicators (" +
               std::to_string(state_->device->device) + "): virtual ranks share one GPU";
      });
    }
  }
  ~InProcessDeviceCommunicator() override {
    const cuda::DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  InProcessDeviceCommunicator(const InProcessDeviceCommunicator&) = delete;
  InProcessDeviceCommunicator& operator=(const InProcessDeviceCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return state_->size; }
  void start_pending() override {}  // copies are enqueued when their second side is posted
  void* stream() const override { return stream_; }
  int device() const override { return device_; }
  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->fail_locked(reason);
  }
  bool healthy() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return !state_->failed;
  }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    if (bytes == 0) return std::make_unique<DoneRequest>();
    return post_side(true, data, bytes, peer, tag);
  }
  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    check_peer(peer);
    if (bytes == 0) return std::make_unique<DoneRequest>();
    return post_side(false, data, bytes, peer, tag);
  }

  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    require_reducible(dtype);
    require(count >= 0, "count",
            [&] { return "must not be negative, got " + std::to_string(count); });
    if (count == 0) return std::make_unique<DoneRequest>();
    return post_collective(CollectiveKind::kAllReduce, data, data,
                           size_t(count) * dtype_size(dtype), size_t(count) * dtype_size(dtype),
                           count, dtype);
  }
  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return std::make_unique<DoneRequest>();
    return post_collective(CollectiveKind::kAllGather, send_data, recv_data, bytes_per_rank,
                           bytes_per_rank * size_t(size()), 0, DType::kFloat32);
  }
  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    require_reducible(dtype);
    require(count_per_rank >= 0, "count_per_rank",
            [&] { return "must not be negative, got " + std::to_string(count_per_rank); });
    if (count_per_rank == 0) return std::make_unique<DoneRequest>();
    const size_t block = size_t(count_per_rank) * dtype_size(dtype);
    return post_collective(CollectiveKind::kReduceScatter, send_data, recv_data,
                           block * size_t(size()), block, count_per_rank, dtype);
  }
  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return std::make_unique<DoneRequest>();
    const size_t bytes = bytes_per_rank * size_t(size());
    return post_collective(CollectiveKind::kAllToAll, send_data, recv_data, bytes, bytes, 0,
                           DType::kFloat32);
  }

 private:
  void check_peer(int peer) const {
    require(peer >= 0 && peer < size(), "peer", [&] {
      return "must be a rank in [0, " + std::to_string(size()) + "), got " + std::to_string(peer);
    });
  }

  // A buffer must be device memory of the group's device (a host pointer would fault in a copy).
  void check_device_pointer(const void* data, size_t bytes, const char* name) const {
    if (bytes == 0) return;
    require(cuda::is_device_memory_of(data, device_), name,
            [&] { return "must be device memory on CUDA device " + std::to_string(device_); });
  }

  // An event of this communicator's device, not yet recorded.
  std::shared_ptr<Event> new_event() const {
    const cuda::DeviceGuard guard(device_);
    return std::make_shared<Event>(*state_);
  }
  // An event on this rank's stream after the work ordered before the post.
  std::shared_ptr<Event> record_ready() const {
    auto event = new_event();
    const cuda::DeviceGuard guard(device_);
    check(*state_, cudaEventRecord(event->get(), stream_), "recording a post");
    return event;
  }

  CommHandle post_side(bool sending, const void* data, size_t bytes, int peer, int tag) {
    check_device_pointer(data, bytes, "data");
    const std::pair<int, int> key =
        sending ? std::make_pair(rank_, peer) : std::make_pair(peer, rank_);
    const std::string what = std::string(sending ? "a send" : "a receive") + " from rank " +
                             std::to_string(key.first) + " to rank " + std::to_string(key.second) +
                             " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) +
                             " bytes)";
    Side side{data, bytes, record_ready(), tag};
    auto done = new_event();  // used if this post completes the transfer
    const cuda::DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failed) throw in_process_error("in-process group failed: " + state_->failure);
    auto& queue = state_->device->open[key];
    std::shared_ptr<Transfer> transfer;
    const bool matches =
        !queue.empty() && (sending ? !queue.front()->has_send : !queue.front()->has_recv);
    if (matches) {
      transfer = queue.front();
      queue.pop_front();
    } else {
      transfer = std::make_shared<Transfer>();
      queue.push_back(transfer);
    }
    (sending ? transfer->send : transfer->recv) = std::move(side);
    (sending ? transfer->has_send : transfer->has_recv) = true;
    if (matches) enqueue_copy(*transfer, std::move(done));
    // Abandoned unmatched: out of the queue, so that the peer never copies to or from it.
    auto abandon = [state = state_.get(), transfer, key] {
      auto& pending = state->device->open[key];
      for (auto it = pending.begin(); it != pending.end(); ++it)
        if (*it == transfer) {
          pending.erase(it);
          break;
        }
    };
    return std::make_unique<DeviceRequest<Transfer>>(state_, transfer, what, abandon, nullptr);
  }

  // Runs `enqueue` (CUDA calls on this rank's stream, the state's lock held). On any failure the
  // group fails and the stream drains before the error goes on: whatever `enqueue` had queued
  // reads or writes buffers that the peers, seeing the operation never enqueued, may release.
  template <typename Enqueue>
  void enqueue_or_fail(Enqueue enqueue) {
    try {
      enqueue();
    } catch (const std::exception& error) {
      state_->fail_locked(error.what());
      cudaStreamSynchronize(stream_);  // GPU work never waits for the host: safe under the lock
      cudaGetLastError();
      throw;
    }
  }

  // The copy of a matched transfer on this rank's stream, completing `done` (the state's lock
  // held and this communicator's device current). The pair's receives match its sends by order,
  // as over NCCL, so a tag or size that differs is an error of the posting order.
  void enqueue_copy(Transfer& transfer, std::shared_ptr<Event> done) {
    if (transfer.send.tag != transfer.recv.tag || transfer.send.bytes != transfer.recv.bytes) {
      state_->fail_locked("the next receive does not match the next send (sent tag " +
                          std::to_string(transfer.send.tag) + ", " +
                          std::to_string(transfer.send.bytes) + " bytes; receive tag " +
                          std::to_string(transfer.recv.tag) + ", " +
                          std::to_string(transfer.recv.bytes) +
                          " bytes): over NCCL a pair's receives match its sends in order");
      throw in_process_error(state_->failure);
    }
    enqueue_or_fail([&] {
      check_locked(*state_, cudaStreamWaitEvent(stream_, transfer.send.ready->get(), 0),
                   "ordering a copy after its send");
      check_locked(*state_, cudaStreamWaitEvent(stream_, transfer.recv.ready->get(), 0),
                   "ordering a copy after its receive");
      check_locked(*state_,
                   cudaMemcpyAsync(const_cast<void*>(transfer.recv.data), transfer.send.data,
                                   transfer.send.bytes, cudaMemcpyDeviceToDevice, stream_),
                   "copying a message");
      check_locked(*state_, cudaEventRecord(done->get(), stream_), "recording a copy");
    });
    transfer.done = std::move(done);
    transfer.enqueued = true;
    state_->changed.notify_all();
  }

  CommHandle post_collective(CollectiveKind kind, const void* input, void* output,
                             size_t input_bytes, size_t output_bytes, int64_t count, DType dtype) {
    check_device_pointer(input, input_bytes, kind == CollectiveKind::kAllReduce ? "data" : "send");
    check_device_pointer(output, output_bytes,
                         kind == CollectiveKind::kAllReduce ? "data" : "recv");
    const uint64_t sequence = next_collective_++;
    const std::string what = std::string(collective_name(kind)) + " #" + std::to_string(sequence);
    Side side{input, input_bytes, record_ready(), 0};
    auto done = new_event();  // used if this rank posts last
    const cuda::DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->failed) throw in_process_error("in-process group failed: " + state_->failure);
    std::shared_ptr<Collective>& slot = state_->device->collectives[sequence];
    if (!slot) {
      slot = std::make_shared<Collective>();
      slot->kind = kind;
      slot->bytes = input_bytes;
      slot->count = count;
      slot->dtype = dtype;
      slot->inputs.resize(size_t(state_->size));
      slot->outputs.resize(size_t(state_->size));
    } else if (slot->kind != kind || slot->bytes != input_bytes || slot->dtype != dtype) {
      state_->fail_locked(what + " mismatch: rank " + std::to_string(rank_) + " posted " +
                          collective_name(kind) + " of " + std::to_string(input_bytes) +
                          " bytes, another rank " + collective_name(slot->kind) + " of " +
                          std::to_string(slot->bytes));
      throw in_process_error(state_->failure);
    }
    slot->inputs[size_t(rank_)] = std::move(side);
    slot->outputs[size_t(rank_)] = output;
    if (++slot->posted == state_->size) run_collective(*slot, std::move(done));
    // The last rank to see it complete releases the rendezvous' slot.
    auto finished = [state = state_.get(), collective = slot.get(), sequence] {
      if (++collective->finished == state->size) state->device->collectives.erase(sequence);
    };
    return std::make_unique<DeviceRequest<Collective>>(state_, slot, what, nullptr, finished);
  }

  // Every rank's output from a snapshot of every input, on this rank's stream (the last to post),
  // completing `done` (the state's lock held and this communicator's device current).
  void run_collective(Collective& c, std::shared_ptr<Event> done) {
    const int n = state_->size;
    const size_t bytes = c.bytes;  // > 0: empty collectives complete at once
    auto must = [&](cudaError_t error, const char* what) { check_locked(*state_, error, what); };
    auto copy = [&](void* to, const void* from, size_t size) {
      must(cudaMemcpyAsync(to, from, size, cudaMemcpyDeviceToDevice, stream_),
           "writing a collective's output");
    };
    enqueue_or_fail([&] {
      for (const Side& input : c.inputs)
        must(cudaStreamWaitEvent(stream_, input.ready->get(), 0), "ordering a collective");
      void* scratch = nullptr;
      must(cudaMallocAsync(&scratch, bytes * size_t(n), stream_), "allocating a collective");
      auto* snapshot = static_cast<unsigned char*>(scratch);
      try {
        for (int r = 0; r < n; ++r)
          must(cudaMemcpyAsync(snapshot + size_t(r) * bytes, c.inputs[size_t(r)].data, bytes,
                               cudaMemcpyDeviceToDevice, stream_),
               "snapshotting a collective's input");
        switch (c.kind) {
          case CollectiveKind::kAllReduce:
            cuda::sum_arrays(c.outputs[0], snapshot, n, c.count, c.count, c.dtype, stream_);
            for (int r = 1; r < n; ++r) copy(c.outputs[size_t(r)], c.outputs[0], bytes);
            break;
          case CollectiveKind::kAllGather:
            for (int r = 0; r < n; ++r) copy(c.outputs[size_t(r)], snapshot, bytes * size_t(n));
            break;
          case CollectiveKind::kReduceScatter: {
            const size_t block = bytes / size_t(n);
            for (int r = 0; r < n; ++r)
              cuda::sum_arrays(c.outputs[size_t(r)], snapshot + size_t(r) * block, n, c.count * n,
                               c.count, c.dtype, stream_);
            break;
          }
          case CollectiveKind::kAllToAll: {
            const size_t block = bytes / size_t(n);
            for (int r = 0; r < n; ++r)
              for (int j = 0; j < n; ++j)
                copy(static_cast<unsigned char*>(c.outputs[size_t(r)]) + size_t(j) * block,
                     snapshot + size_t(j) * bytes + size_t(r) * block, block);
            break;
          }
        }
      } catch (...) {
        cudaFreeAsync(scratch, stream_);  // after whatever was queued
        throw;
      }
      must(cudaFreeAsync(scratch, stream_), "releasing a collective's snapshot");
      must(cudaEventRecord(done->get(), stream_), "recording a collective");
    });
    c.done = std::move(done);
    c.enqueued = true;
    state_->changed.notify_all();
  }

  std::shared_ptr<State> state_;
  int rank_;
  int device_;
  cudaStream_t stream_ = nullptr;
  uint64_t next_collective_ = 0;
};

}  // namespace

std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::shared_ptr<InProcessGroup::State> state, int rank, int device) {
  return std::make_unique<InProcessDeviceCommunicator>(std::move(state), rank, device);
}

#else

std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::shared_ptr<InProcessGroup::State>, int, int) {
  throw Error(ErrorCode::kNotSupported, "device",
              "dpa was built without CUDA: there are no device communicators");
}

#endif

}  // namespace dpa::cp
