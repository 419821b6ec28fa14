// The NCCL Communicator (include/dpa/nccl.h, docs/nccl.md): one process per GPU.
//
// Why it looks like this:
// - Non-blocking NCCL communicator (ncclConfig_t::blocking = 0): no NCCL call blocks the host,
//   so every wait can have a deadline, and ncclCommAbort can always be reached. After each
//   NCCL call that may return ncclInProgress we poll ncclCommGetAsyncError until the call has
//   really enqueued its work (NCCL forbids using the stream before that), then record an event.
// - wait() polls that event and the communicator's async error until done, error or deadline;
//   a failure aborts the communicator, which makes its spinning kernels exit, so a dead peer
//   turns into an exception on every other rank instead of a hang.
// - Point-to-point operations are queued and launched together in one ncclGroupStart/End at
//   the first wait, collective or start_pending(): NCCL's send blocks the GPU until the peer
//   receives, so a ring (everyone sends, then receives) needs the sends and receives in one
//   group. Matching is by per-peer posting order (NCCL has no tags); see nccl.h.
// - all_to_all is a group of sends and receives (works on every NCCL with p2p, >= 2.7).
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cp/comm_requests.h"
#include "cuda/runtime.h"
#include "dpa/error.h"
#include "dpa/nccl.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the dpa NCCL communicator needs NCCL >= 2.14 (non-blocking communicators)"
#endif

namespace dpa {

namespace {

static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes, "ncclUniqueId size changed");

using Clock = std::chrono::steady_clock;
using cp::Backoff;
using cp::DoneRequest;

Error comm_error(const std::string& message) {
  return Error(ErrorCode::kBackendFailure, "communicator", message);
}

std::string nccl_text(ncclResult_t result) {
  std::string text = ncclGetErrorString(result);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += " (" + std::string(last) + ")";
  return text;
}

std::string cuda_text(cudaError_t error) {
  return std::string(cudaGetErrorName(error)) + ": " + cudaGetErrorString(error);
}

// Makes `device` current for the scope and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = cudaSetDevice(device);
      restore_ = previous_ >= 0 && status_ == cudaSuccess;
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool restore_ = false;
  cudaError_t status_ = cudaSuccess;
};

// One enqueued NCCL call or group; complete when `event` is. Shared by the handles of a group.
struct Launch {
  cudaEvent_t event = nullptr;
  bool launched = false;
  bool done = false;
  ~Launch() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

struct P2pOp {
  bool is_send = false;
  void* data = nullptr;
  size_t bytes = 0;
  int peer = 0;
};

std::string describe(const P2pOp& op) {
  return std::string(op.is_send ? "send of " : "recv of ") + std::to_string(op.bytes) + " bytes " +
         (op.is_send ? "to" : "from") + " rank " + std::to_string(op.peer);
}

std::string dtype_name(DType dtype) { return std::string(to_string(dtype)); }

ncclDataType_t reduction_type(DType dtype) {
  require(dtype == DType::kFloat32 || dtype == DType::kFloat64, "dtype",
          [&] { return "reductions take float32 or float64 data, got " + dtype_name(dtype); });
  return dtype == DType::kFloat32 ? ncclFloat32 : ncclFloat64;
}

// The communicator's state, shared with its handles (a handle may outlive the communicator).
class NcclState {
 public:
  NcclState(int rank, int size, int device, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), device_(device), timeout_(timeout) {}
  NcclState(const NcclState&) = delete;
  NcclState& operator=(const NcclState&) = delete;
  ~NcclState() { shutdown(); }

  int rank() const { return rank_; }
  int size() const { return size_; }
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  bool healthy() const { return !failed_; }

  void init(const ncclUniqueId& id, void* user_stream, Clock::time_point deadline) {
    const std::string what = "nccl init";
    DeviceGuard guard(device_);
    if (guard.status() != cudaSuccess)
      throw comm_error(what + " on " + where() + ": cannot select CUDA device " +
                       std::to_string(device_) + ": " + cuda_text(guard.status()));
    if (user_stream != nullptr) {
      stream_ = static_cast<cudaStream_t>(user_stream);
    } else {
      check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), what,
                 "cudaStreamCreateWithFlags");
      owns_stream_ = true;
    }
    check_cuda(cudaEventCreateWithFlags(&legacy_done_, cudaEventDisableTiming), what,
               "cudaEventCreateWithFlags");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t result = ncclCommInitRankConfig(&comm, size_, id, rank_, &config);
    comm_ = comm;
    if (result != ncclSuccess && result != ncclInProgress) {
      if (comm_ != nullptr) ncclCommAbort(comm_);
      comm_ = nullptr;
      failed_ = true;
      failure_ = "ncclCommInitRankConfig failed";
      throw comm_error(what + " on " + where() + ": ncclCommInitRankConfig: " + nccl_text(result));
    }
    settle(what, deadline,
           "not every rank joined (a rank missing or slow to start, ranks with different ids "
           "or sizes, or no network path between them)");
  }

  // ---- posting ----

  CommHandle queue(const P2pOp& op, std::shared_ptr<NcclState> self) {
    const std::string what = "nccl " + describe(op);
    ensure_healthy(what);
    if (!queued_launch_) queued_launch_ = std::make_shared<Launch>();
    queued_.push_back(op);
    return handle(std::move(self), queued_launch_, what);
  }

  // Launches the queued point-to-point operations as one group; NCCL must have enqueued them
  // by `deadline`.
  void flush() { flush(Clock::now() + timeout_); }
  void flush(Clock::time_point deadline) {
    if (queued_.empty()) return;
    const std::vector<P2pOp> ops = std::move(queued_);
    queued_.clear();
    const std::shared_ptr<Launch> launch = std::move(queued_launch_);
    queued_launch_.reset();
    std::string what = "nccl group of " + std::to_string(ops.size()) + " point-to-point ops (";
    for (size_t i = 0; i < ops.size() && i < 4; ++i) what += (i ? ", " : "") + describe(ops[i]);
    what += ops.size() > 4 ? ", ...)" : ")";

    DeviceGuard guard(device_);
    enter(guard, what);
    check_nccl(ncclGroupStart(), what, "ncclGroupStart");
    ncclResult_t first_error = ncclSuccess;
    std::string failed_call;
    for (const P2pOp& op : ops) {
      const ncclResult_t result =
          op.is_send ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_)
                     : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_);
      if (result != ncclSuccess && result != ncclInProgress) {
        first_error = result;
        failed_call = describe(op);
        break;
      }
    }
    // A started group is always ended, also after an error inside it.
    const ncclResult_t end = ncclGroupEnd();
    if (first_error != ncclSuccess) fail(what, failed_call + ": " + nccl_text(first_error));
    check_nccl(end, what, "ncclGroupEnd");
    record(*launch, what, deadline);
  }

  // Runs `enqueue` (NCCL calls on the stream) as one operation and returns its handle.
  template <typename Enqueue>
  CommHandle post(std::shared_ptr<NcclState> self, const std::string& what, Enqueue enqueue) {
    ensure_healthy(what);
    const auto deadline = Clock::now() + timeout_;
    flush(deadline);  // point-to-point operations posted earlier keep their place in the order
    DeviceGuard guard(device_);
    enter(guard, what);
    enqueue();
    auto launch = std::make_shared<Launch>();
    record(*launch, what, deadline);
    return handle(std::move(self), std::move(launch), what);
  }

  void check_nccl(ncclResult_t result, const std::string& what, const char* call) {
    if (result != ncclSuccess && result != ncclInProgress)
      fail(what, std::string(call) + ": " + nccl_text(result));
  }

  void check_cuda(cudaError_t error, const std::string& what, const char* call) {
    if (error != cudaSuccess) fail(what, std::string(call) + ": " + cuda_text(error));
  }

  ncclComm_t comm() const { return comm_; }

  // ---- completion ----

  void wait(Launch& launch, const std::string& what) {
    if (launch.done) return;
    ensure_healthy(what);
    // One deadline for launching (when the handle belongs to the queued group) and completing.
    const auto deadline = Clock::now() + timeout_;
    launch_group_of(launch, what, deadline);
    DeviceGuard guard(device_);
    if (guard.status() != cudaSuccess)
      fail(what, "cannot select CUDA device: " + cuda_text(guard.status()));
    Backoff backoff;
    for (;;) {
      const cudaError_t status = cudaEventQuery(launch.event);
      if (status == cudaSuccess) {
        launch.done = true;
        return;
      }
      if (status != cudaErrorNotReady) fail(what, "CUDA error while waiting: " + cuda_text(status));
      poll_async_error(what);
      if (Clock::now() >= deadline)
        fail(what, "not complete after " + std::to_string(timeout_.count()) +
                       " ms: a peer died, hangs, or did not post the matching operation");
      backoff.pause();
    }
  }

  // Orders `stream` after the operation's completion event (launching its group first, as
  // wait() does), without waiting on the host; wait() still polls it for errors and deadlines.
  void order_stream(Launch& launch, void* stream, const std::string& what) {
    if (launch.done) return;
    ensure_healthy(what);
    launch_group_of(launch, what, Clock::now() + timeout_);
    DeviceGuard guard(device_);
    if (guard.status() != cudaSuccess)
      fail(what, "cannot select CUDA device: " + cuda_text(guard.status()));
    check_cuda(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), launch.event, 0), what,
               "cudaStreamWaitEvent");
  }

  void abort(const std::string& reason) {
    if (failed_) return;
    failed_ = true;
    failure_ = reason;
    abort_comm();
  }

 private:
  // Launches the queued point-to-point group when `launch` belongs to it.
  void launch_group_of(const Launch& launch, const std::string& what, Clock::time_point deadline) {
    if (!launch.launched) {
      try {
        flush(deadline);
      } catch (const Error& error) {
        throw comm_error(what + " on " + where() +
                         ": launching its point-to-point group failed: " + error.what());
      }
    }
    if (!launch.launched) throw comm_error(what + " on " + where() + ": internal: never launched");
  }

  std::string where() const {
    return "rank " + std::to_string(rank_) + " of " + std::to_string(size_);
  }

  void ensure_healthy(const std::string& what) const {
    if (failed_)
      throw comm_error(what + " on " + where() + ": the communicator was aborted earlier (" +
                       failure_ + ")");
  }

  // Aborts NCCL (stopping its kernels) and throws; every later operation throws too.
  [[noreturn]] void fail(const std::string& what, const std::string& why) {
    const std::string message = what + " on " + where() + ": " + why + "; communicator aborted";
    if (!failed_) {
      failed_ = true;
      failure_ = message;
      abort_comm();
    }
    throw comm_error(message);
  }

  void abort_comm() {
    if (comm_ == nullptr) return;
    DeviceGuard guard(device_);
    ncclCommAbort(comm_);  // the result does not matter: the communicator is gone either way
    comm_ = nullptr;
  }

  // Before enqueueing: health, device, and order after the legacy default stream (work the
  // caller issued there, e.g. the kernel that produced a send buffer).
  void enter(const DeviceGuard& guard, const std::string& what) {
    ensure_healthy(what);
    if (guard.status() != cudaSuccess)
      fail(what, "cannot select CUDA device " + std::to_string(device_) + ": " +
                     cuda_text(guard.status()));
    // Also for a caller's stream: a non-blocking one does not wait for the legacy stream.
    check_cuda(cudaEventRecord(legacy_done_, cudaStreamLegacy), what, "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, legacy_done_, 0), what, "cudaStreamWaitEvent");
  }

  // After the NCCL calls of one operation: wait until NCCL has really enqueued them, then mark
  // their completion with an event.
  void record(Launch& launch, const std::string& what, Clock::time_point deadline) {
    settle(what, deadline,
           "NCCL did not finish enqueueing (connection setup with a peer that never came?)");
    check_cuda(cudaEventCreateWithFlags(&launch.event, cudaEventDisableTiming), what,
               "cudaEventCreateWithFlags");
    check_cuda(cudaEventRecord(launch.event, stream_), what, "cudaEventRecord");
    launch.launched = true;
  }

  // Polls the communicator state until it leaves ncclInProgress.
  void settle(const std::string& what, Clock::time_point deadline, const std::string& stuck) {
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
      if (result != ncclSuccess) fail(what, "ncclCommGetAsyncError: " + nccl_text(result));
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(what, nccl_text(state));
      if (Clock::now() >= deadline)
        fail(what, "timed out after " + std::to_string(timeout_.count()) + " ms: " + stuck);
      backoff.pause();
    }
  }

  void poll_async_error(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) fail(what, "ncclCommGetAsyncError: " + nccl_text(result));
    if (state != ncclSuccess && state != ncclInProgress)
      fail(what, "NCCL reported " + nccl_text(state));
  }

  CommHandle handle(std::shared_ptr<NcclState> self, std::shared_ptr<Launch> launch,
                    const std::string& what);

  // Drains and finalizes within the timeout; aborts when anything goes wrong. Never throws.
  void shutdown() noexcept {
    DeviceGuard guard(device_);
    if (comm_ != nullptr) {
      // Queued operations whose handles were dropped unlaunched leave the peers inconsistent.
      bool clean = !failed_ && queued_.empty() && guard.status() == cudaSuccess;
      const auto deadline = Clock::now() + timeout_;
      cudaEvent_t drained = nullptr;
      if (clean) {
        clean = cudaEventCreateWithFlags(&drained, cudaEventDisableTiming) == cudaSuccess &&
                cudaEventRecord(drained, stream_) == cudaSuccess;
        Backoff backoff;
        while (clean) {
          const cudaError_t status = cudaEventQuery(drained);
          if (status == cudaSuccess) break;
          ncclResult_t state = ncclSuccess;
          if (status != cudaErrorNotReady || ncclCommGetAsyncError(comm_, &state) != ncclSuccess ||
              (state != ncclSuccess && state != ncclInProgress) || Clock::now() >= deadline)
            clean = false;
          backoff.pause();
        }
      }
      if (drained != nullptr) cudaEventDestroy(drained);
      if (clean) {
        const ncclResult_t result = ncclCommFinalize(comm_);
        clean = result == ncclSuccess || result == ncclInProgress;
        Backoff backoff;
        while (clean) {
          ncclResult_t state = ncclSuccess;
          if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) {
            clean = false;
          } else if (state == ncclSuccess) {
            break;
          } else if (state != ncclInProgress || Clock::now() >= deadline) {
            clean = false;
          }
          backoff.pause();
        }
      }
      if (clean)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    if (legacy_done_ != nullptr) cudaEventDestroy(legacy_done_);
    if (owns_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  const int rank_, size_, device_;
  const std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = false;
  cudaEvent_t legacy_done_ = nullptr;
  bool failed_ = false;
  std::string failure_;
  std::vector<P2pOp> queued_;
  std::shared_ptr<Launch> queued_launch_;
};

class NcclRequest final : public CommRequest {
 public:
  NcclRequest(std::shared_ptr<NcclState> state, std::shared_ptr<Launch> launch, std::string what)
      : state_(std::move(state)), launch_(std::move(launch)), what_(std::move(what)) {}
  // A handle dropped before its operation completed (an exception between posting and
  // waiting) leaves NCCL with buffers the caller may free and peers expecting a matching
  // operation: abort the communicator, so later calls fail instead of touching freed memory.
  ~NcclRequest() override {
    if (!launch_->done && state_->healthy())
      state_->abort("a handle was destroyed before its operation (" + what_ + ") was waited");
  }
  NcclRequest(const NcclRequest&) = delete;
  NcclRequest& operator=(const NcclRequest&) = delete;
  void wait() override {
    state_->wait(*launch_, what_);
    launch_->done = true;
  }
  void wait_on_stream(void* stream) override { state_->order_stream(*launch_, stream, what_); }

 private:
  std::shared_ptr<NcclState> state_;
  std::shared_ptr<Launch> launch_;
  std::string what_;
};

CommHandle NcclState::handle(std::shared_ptr<NcclState> self, std::shared_ptr<Launch> launch,
                             const std::string& what) {
  return std::make_unique<NcclRequest>(std::move(self), std::move(launch), what);
}

class NcclCommunicatorImpl final : public NcclCommunicator {
 public:
  explicit NcclCommunicatorImpl(std::shared_ptr<NcclState> state) : state_(std::move(state)) {}

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  int device() const override { return state_->device(); }
  void* stream() const override { return state_->stream(); }
  bool healthy() const override { return state_->healthy(); }
  void abort(const std::string& reason) override { state_->abort(reason); }
  void start_pending() override { state_->flush(); }

  CommHandle send(const void* data, size_t bytes, int peer, int /*tag*/) override {
    check_peer(peer);
    if (bytes == 0) return std::make_unique<DoneRequest>();
    require_device_memory(data, "data");
    return state_->queue({true, const_cast<void*>(data), bytes, peer}, state_);
  }

  CommHandle recv(void* data, size_t bytes, int peer, int /*tag*/) override {
    check_peer(peer);
    if (bytes == 0) return std::make_unique<DoneRequest>();
    require_device_memory(data, "data");
    return state_->queue({false, data, bytes, peer}, state_);
  }

  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    const ncclDataType_t type = reduction_type(dtype);
    require(count >= 0, "count", "must be >= 0");
    if (count == 0) return std::make_unique<DoneRequest>();
    require_device_memory(data, "data");
    const std::string what =
        "nccl all_reduce of " + std::to_string(count) + " " + dtype_name(dtype);
    NcclState& s = *state_;
    return s.post(state_, what, [&] {
      s.check_nccl(ncclAllReduce(data, data, size_t(count), type, ncclSum, s.comm(), s.stream()),
                   what, "ncclAllReduce");
    });
  }

  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return std::make_unique<DoneRequest>();
    require_device_memory(send_data, "send");
    require_device_memory(recv_data, "recv");
    const std::string what =
        "nccl all_gather of " + std::to_string(bytes_per_rank) + " bytes per rank";
    NcclState& s = *state_;
    return s.post(state_, what, [&] {
      s.check_nccl(
          ncclAllGather(send_data, recv_data, bytes_per_rank, ncclUint8, s.comm(), s.stream()),
          what, "ncclAllGather");
    });
  }

  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    const ncclDataType_t type = reduction_type(dtype);
    require(count_per_rank >= 0, "count_per_rank", "must be >= 0");
    if (count_per_rank == 0) return std::make_unique<DoneRequest>();
    require_device_memory(send_data, "send");
    require_device_memory(recv_data, "recv");
    const std::string what = "nccl reduce_scatter of " + std::to_string(count_per_rank) + " " +
                             dtype_name(dtype) + " per rank";
    NcclState& s = *state_;
    return s.post(state_, what, [&] {
      s.check_nccl(ncclReduceScatter(send_data, recv_data, size_t(count_per_rank), type, ncclSum,
                                     s.comm(), s.stream()),
                   what, "ncclReduceScatter");
    });
  }

  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    if (bytes_per_rank == 0) return std::make_unique<DoneRequest>();
    require_device_memory(send_data, "send");
    require_device_memory(recv_data, "recv");
    {
      // NCCL sends and receives the blocks concurrently: the two buffers must not overlap.
      const auto* a = static_cast<const unsigned char*>(send_data);
      const auto* b = static_cast<const unsigned char*>(recv_data);
      const size_t total = bytes_per_rank * size_t(size());
      require(a + total <= b || b + total <= a, "recv",
              "must not overlap send (all_to_all is not in place over NCCL)");
    }
    const std::string what =
        "nccl all_to_all of " + std::to_string(bytes_per_rank) + " bytes per rank";
    NcclState& s = *state_;
    const int me = rank(), n = size();
    const auto* src = static_cast<const unsigned char*>(send_data);
    auto* dst = static_cast<unsigned char*>(recv_data);
    return s.post(state_, what, [&] {
      // The own block is a copy; it goes first, while the stream is still ours to use.
      s.check_cuda(
          cudaMemcpyAsync(dst + size_t(me) * bytes_per_rank, src + size_t(me) * bytes_per_rank,
                          bytes_per_rank, cudaMemcpyDefault, s.stream()),
          what, "cudaMemcpyAsync");
      if (n == 1) return;
      s.check_nccl(ncclGroupStart(), what, "ncclGroupStart");
      ncclResult_t first_error = ncclSuccess;
      int failed_peer = -1;
      for (int peer = 0; peer < n && first_error == ncclSuccess; ++peer) {
        if (peer == me) continue;
        const size_t offset = size_t(peer) * bytes_per_rank;
        ncclResult_t result =
            ncclSend(src + offset, bytes_per_rank, ncclUint8, peer, s.comm(), s.stream());
        if (result == ncclSuccess || result == ncclInProgress)
          result = ncclRecv(dst + offset, bytes_per_rank, ncclUint8, peer, s.comm(), s.stream());
        if (result != ncclSuccess && result != ncclInProgress) {
          first_error = result;
          failed_peer = peer;
        }
      }
      const ncclResult_t end = ncclGroupEnd();
      s.check_nccl(first_error, what + " (peer rank " + std::to_string(failed_peer) + ")",
                   "ncclSend/ncclRecv");
      s.check_nccl(end, what, "ncclGroupEnd");
    });
  }

 private:
  // NCCL kernels read and write device memory of this communicator's GPU; a host pointer
  // would fault (and poison the context) or silently take a slow path.
  void require_device_memory(const void* pointer, const char* name) const {
    require(cuda::is_device_memory_of(pointer, device()), name, [&] {
      return "must be device memory on CUDA device " + std::to_string(device()) +
             " (the NCCL communicator moves device buffers)";
    });
  }

  void check_peer(int peer) const {
    require(peer >= 0 && peer < size(), "peer", [&] {
      return "must be a rank in [0, " + std::to_string(size()) + "), got " + std::to_string(peer);
    });
  }

  std::shared_ptr<NcclState> state_;
};

// The n-th communicator this process bootstraps through one path uses key "<key>#n". Every
// rank creates the same sequence, so the numbers agree, and a rank that comes for the next
// communicator before rank 0 has removed the previous id file skips that file.
int next_generation(const NcclBootstrap& bootstrap) {
  static std::mutex mutex;
  static std::map<std::string, int> generations;
  std::lock_guard<std::mutex> lock(mutex);
  return generations[bootstrap.id_file]++;
}

}  // namespace

std::vector<uint8_t> nccl_unique_id() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) throw comm_error("ncclGetUniqueId: " + nccl_text(result));
  std::vector<uint8_t> bytes(kNcclUniqueIdBytes);
  std::memcpy(bytes.data(), &id, kNcclUniqueIdBytes);
  return bytes;
}

std::unique_ptr<NcclCommunicator> make_nccl_communicator(int rank, int size, int device,
                                                         const NcclBootstrap& bootstrap,
                                                         std::chrono::milliseconds timeout,
                                                         void* stream) {
  // Numbered first, before anything that can throw on one rank only, so that every rank's
  // sequence of keys on this path stays the same.
  const int generation = bootstrap.id_file.empty() ? 0 : next_generation(bootstrap);
  require(size >= 1, "size", [&] { return "must be >= 1, got " + std::to_string(size); });
  require(rank >= 0 && rank < size, "rank", [&] {
    return "must be in [0, " + std::to_string(size) + "), got " + std::to_string(rank);
  });
  require(timeout.count() > 0, "timeout", "must be positive");
  require(bootstrap.unique_id.empty() != bootstrap.id_file.empty(), "bootstrap",
          "needs exactly one of unique_id and id_file");
  require(bootstrap.unique_id.empty() || bootstrap.unique_id.size() == kNcclUniqueIdBytes,
          "bootstrap",
          [&] { return "unique_id must hold " + std::to_string(kNcclUniqueIdBytes) + " bytes"; });
  // NCCL_COMM_BLOCKING=1 would make init, group launches and finalize block, voiding every
  // deadline this communicator promises.
  const char* blocking = std::getenv("NCCL_COMM_BLOCKING");
  require(blocking == nullptr || std::string(blocking) != "1", "NCCL_COMM_BLOCKING",
          "must not be 1: the communicator relies on non-blocking NCCL calls for its timeouts");
  int device_count = 0;
  const cudaError_t status = cudaGetDeviceCount(&device_count);
  if (status != cudaSuccess)
    throw comm_error("nccl init on rank " + std::to_string(rank) +
                     ": no usable CUDA device: " + cuda_text(status));
  require(device >= 0 && device < device_count, "device", [&] {
    return "must be in [0, " + std::to_string(device_count) + "), got " + std::to_string(device);
  });

  const auto deadline = Clock::now() + timeout;
  std::vector<uint8_t> id_bytes = bootstrap.unique_id;
  if (id_bytes.empty()) {
    const std::string key = bootstrap.id_key + "#" + std::to_string(generation);
    if (rank == 0) {
      id_bytes = nccl_unique_id();
      write_nccl_id_file(bootstrap.id_file, id_bytes, key);
    } else {
      id_bytes = read_nccl_id_file(bootstrap.id_file, timeout, key);
    }
  }
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), kNcclUniqueIdBytes);

  // The communicator's device becomes (and stays) current on this thread: restoring a device
  // the process never chose would create a CUDA context on GPU 0 in every rank's process, and
  // one process per GPU wants its GPU current anyway (include/dpa/nccl.h).
  const cudaError_t selected = cudaSetDevice(device);
  if (selected != cudaSuccess)
    throw comm_error("nccl init on rank " + std::to_string(rank) + ": cannot select CUDA device " +
                     std::to_string(device) + ": " + cuda_text(selected));
  auto state = std::make_shared<NcclState>(rank, size, device, timeout);
  state->init(id, stream, std::max(deadline, Clock::now() + std::chrono::milliseconds(1000)));
  // Every rank has joined, so every rank has read the file: remove it, so that a later job on
  // the same path cannot pick up this dead id.
  if (rank == 0 && !bootstrap.id_file.empty()) std::remove(bootstrap.id_file.c_str());
  return std::make_unique<NcclCommunicatorImpl>(std::move(state));
}

}  // namespace dpa
