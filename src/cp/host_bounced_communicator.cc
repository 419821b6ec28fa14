// Device buffers over a host communicator (include/dpa/cp.h, make_host_bounced_communicator):
// the device-buffer interface that context parallelism's device algorithms need, with every
// transfer bounced through host memory. Each operation waits for its stream (which, being a
// blocking stream, also waits for the legacy default stream), copies its device input to a host
// buffer, and hands that to the host communicator, whose rules (matching, deadlines) then hold. The
// host buffers live in the handle until its wait() returns, as Communicator asks. A receiving or
// collective handle copies its host result into the device buffer in wait(), so that after wait()
// the data is ready for any stream, as DeviceCommunicator promises. The copies block the posting
// thread, so nothing overlaps: the compute stays on the GPU and only the messages cross the host.
#include <atomic>
#include <exception>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "dpa/cp.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/runtime.h"

namespace dpa::cp {

namespace {

class BouncedCommunicator;

// The host buffers of one operation and the inner handle: `input` stays alive (and unmodified)
// until the inner operation completes; `output`, when the operation has one, goes to
// `device_data` then. The inner handle is declared last, so it is destroyed first: a host
// communicator may still touch the buffers until its handle is gone.
class BouncedRequest final : public CommRequest {
 public:
  BouncedRequest(std::vector<char> input, std::vector<char> output, void* device_data,
                 const BouncedCommunicator& comm)
      : input_(std::move(input)),
        output_(std::move(output)),
        device_data_(device_data),
        comm_(comm) {}
  // Stable pointers for the inner operation: the vectors are never resized.
  const char* input() const { return input_.data(); }
  char* output() { return output_.data(); }
  void set_inner(CommHandle inner) { inner_ = std::move(inner); }
  void wait() override;

 private:
  std::vector<char> input_, output_;
  void* device_data_;
  const BouncedCommunicator& comm_;
  bool done_ = false;
  CommHandle inner_;
};

class BouncedCommunicator final : public DeviceCommunicator {
 public:
  BouncedCommunicator(Communicator& host, int device) : host_(host), device_(device) {
    require(device >= 0, "device",
            [&] { return "must be a CUDA device index, got " + std::to_string(device); });
    const cuda::DeviceGuard guard(device_);
    check(cudaStreamCreate(&stream_), "creating its stream");  // blocking: after legacy work
  }
  ~BouncedCommunicator() override {
    const cuda::DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  BouncedCommunicator(const BouncedCommunicator&) = delete;
  BouncedCommunicator& operator=(const BouncedCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void start_pending() override {}  // operations start at post
  void* stream() const override { return stream_; }
  int device() const override { return device_; }
  void abort(const std::string& reason) override { fail(reason); }
  bool healthy() const override { return !failed_; }

  // Fails this view: later operations and waits throw with the first reason.
  void fail(const std::string& reason) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (reason_.empty()) reason_ = reason;
    }
    failed_ = true;
  }
  // Throws, naming the first failure, once this view failed.
  void require_healthy() const {
    if (!failed_) return;
    std::string reason;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reason = reason_;
    }
    throw Error(
        ErrorCode::kBackendFailure, "communicator",
        "host-bounced device communicator (rank " + std::to_string(host_.rank()) + "): " + reason);
  }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    auto request = bounce(download(data, bytes, "data"), 0, nullptr);
    request->set_inner(host_.send(request->input(), bytes, peer, tag));
    return request;
  }
  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    check_device_pointer(data, bytes, "data");
    auto request = bounce({}, bytes, data);
    request->set_inner(host_.recv(request->output(), bytes, peer, tag));
    return request;
  }
  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    const size_t bytes = size_t(count) * dtype_size(dtype);
    auto request = bounce({}, bytes, data);
    download_into(request->output(), data, bytes, "data");
    request->set_inner(host_.all_reduce(request->output(), count, dtype));
    return request;
  }
  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    check_device_pointer(recv_data, bytes_per_rank * size_t(size()), "recv");
    auto request = bounce(download(send_data, bytes_per_rank, "send"),
                          bytes_per_rank * size_t(size()), recv_data);
    request->set_inner(host_.all_gather(request->input(), request->output(), bytes_per_rank));
    return request;
  }
  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    const size_t block = size_t(count_per_rank) * dtype_size(dtype);
    check_device_pointer(recv_data, block, "recv");
    auto request = bounce(download(send_data, block * size_t(size()), "send"), block, recv_data);
    request->set_inner(
        host_.reduce_scatter(request->input(), request->output(), count_per_rank, dtype));
    return request;
  }
  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    const size_t bytes = bytes_per_rank * size_t(size());
    check_device_pointer(recv_data, bytes, "recv");
    auto request = bounce(download(send_data, bytes, "send"), bytes, recv_data);
    request->set_inner(host_.all_to_all(request->input(), request->output(), bytes_per_rank));
    return request;
  }

  // Host bytes -> device, after the inner operation completed.
  void upload(void* device_data, const char* host, size_t bytes) const {
    if (bytes == 0) return;
    const cuda::DeviceGuard guard(device_);
    check(cudaMemcpyAsync(device_data, host, bytes, cudaMemcpyHostToDevice, stream_),
          "copying a result to the device");
    check(cudaStreamSynchronize(stream_), "copying a result to the device");
  }

 private:
  void check(cudaError_t error, const std::string& what) const {
    if (error == cudaSuccess) return;
    cudaGetLastError();
    const std::string message = "host-bounced device communicator (rank " +
                                std::to_string(host_.rank()) + "): " + what + ": " +
                                cudaGetErrorName(error) + " " + cudaGetErrorString(error);
    fail(message);
    throw Error(ErrorCode::kBackendFailure, "communicator", message);
  }

  // Refuses operations after a failure or an abort, as DeviceCommunicator promises.
  std::unique_ptr<BouncedRequest> bounce(std::vector<char> input, size_t output_bytes,
                                         void* device_data) const {
    require_healthy();
    return std::make_unique<BouncedRequest>(std::move(input), std::vector<char>(output_bytes),
                                            device_data, *this);
  }

  // A buffer must be device memory of this communicator's device (a host pointer would be
  // copied as if it were one, silently).
  void check_device_pointer(const void* data, size_t bytes, const char* name) const {
    if (bytes == 0) return;
    require(cuda::is_device_memory_of(data, device_), name,
            [&] { return "must be device memory on CUDA device " + std::to_string(device_); });
  }

  // Device bytes -> a host buffer, after every operation ordered before the post.
  std::vector<char> download(const void* data, size_t bytes, const char* name) const {
    std::vector<char> host(bytes);
    download_into(host.data(), data, bytes, name);
    return host;
  }
  void download_into(char* host, const void* data, size_t bytes, const char* name) const {
    check_device_pointer(data, bytes, name);
    if (bytes == 0) return;
    const cuda::DeviceGuard guard(device_);
    check(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, stream_),
          "copying an input to the host");
    check(cudaStreamSynchronize(stream_), "copying an input to the host");
  }

  Communicator& host_;
  int device_;
  mutable std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  mutable std::string reason_;  // the first failure (guarded by mutex_)
  cudaStream_t stream_ = nullptr;
};

void BouncedRequest::wait() {
  if (done_) return;
  comm_.require_healthy();
  try {
    inner_->wait();
  } catch (const std::exception& error) {
    comm_.fail(error.what());  // a failed transfer fails the view, as DeviceCommunicator says
    throw;
  }
  comm_.upload(device_data_, output_.data(), output_.size());
  done_ = true;
}

}  // namespace

}  // namespace dpa::cp

namespace dpa {

std::unique_ptr<DeviceCommunicator> make_host_bounced_communicator(Communicator& host, int device) {
  require(host.device_communicator() == nullptr, "host",
          "moves device buffers already; it needs no host-bounced view");
  return std::make_unique<cp::BouncedCommunicator>(host, device);
}

}  // namespace dpa

#else

namespace dpa {

std::unique_ptr<DeviceCommunicator> make_host_bounced_communicator(Communicator&, int) {
  throw Error(ErrorCode::kNotSupported, "device",
              "dpa was built without CUDA: there are no device communicators");
}

}  // namespace dpa

#endif
