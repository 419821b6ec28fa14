// Device buffers over the in-process group (cp/in_process_device.h). Each operation waits for
// its stream (which, being a blocking stream, also waits for the legacy default stream), copies
// its device input to a host buffer, and hands that to the rank's host communicator: buffered
// sends and snapshot collectives keep the group's rules and deadlines. A receiving or
// collective handle copies its host result into the device buffer in wait(), so that after
// wait() the data is ready for any stream, as DeviceCommunicator promises. Nothing overlaps:
// virtual ranks on one GPU exist to test the device algorithms, not to time them.
#include "cp/in_process_device.h"

#include <utility>
#include <vector>

#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/runtime.h"
#endif

namespace dpa::cp {

#if defined(DPA_WITH_CUDA)

namespace {

class InProcessDeviceCommunicator;

// A host buffer whose contents go to device memory when the inner operation completes.
class UploadRequest final : public CommRequest {
 public:
  UploadRequest(std::vector<char> host, void* device_data, const InProcessDeviceCommunicator& comm)
      : host_(std::move(host)), device_data_(device_data), comm_(comm) {}
  // The host buffer for the inner operation to fill (stable: the vector is never resized).
  char* host_data() { return host_.data(); }
  void set_inner(CommHandle inner) { inner_ = std::move(inner); }
  void wait() override;

 private:
  CommHandle inner_;
  std::vector<char> host_;
  void* device_data_;
  const InProcessDeviceCommunicator& comm_;
  bool done_ = false;
};

class InProcessDeviceCommunicator final : public DeviceCommunicator {
 public:
  InProcessDeviceCommunicator(std::unique_ptr<Communicator> host, int device, GroupControl control)
      : host_(std::move(host)), device_(device), control_(std::move(control)) {
    const cuda::DeviceGuard guard(device_);
    check(cudaStreamCreate(&stream_), "creating its stream");  // blocking: after legacy work
  }
  ~InProcessDeviceCommunicator() override {
    const cuda::DeviceGuard guard(device_);
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  InProcessDeviceCommunicator(const InProcessDeviceCommunicator&) = delete;
  InProcessDeviceCommunicator& operator=(const InProcessDeviceCommunicator&) = delete;

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void start_pending() override {}  // operations complete (sends) or start (the rest) at post
  void* stream() const override { return stream_; }
  int device() const override { return device_; }
  void abort(const std::string& reason) override { control_.abort(reason); }
  bool healthy() const override { return control_.healthy(); }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    const std::vector<char> host = download(data, bytes, "data");
    return host_->send(host.data(), bytes, peer, tag);  // buffered: copied at post
  }
  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    check_device_pointer(data, bytes, "data");
    auto request = std::make_unique<UploadRequest>(std::vector<char>(bytes), data, *this);
    request->set_inner(host_->recv(request->host_data(), bytes, peer, tag));
    return request;
  }
  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    const size_t bytes = size_t(count) * dtype_size(dtype);
    auto request = std::make_unique<UploadRequest>(download(data, bytes, "data"), data, *this);
    request->set_inner(host_->all_reduce(request->host_data(), count, dtype));
    return request;
  }
  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    const std::vector<char> input = download(send_data, bytes_per_rank, "send");
    check_device_pointer(recv_data, bytes_per_rank * size_t(size()), "recv");
    auto request = std::make_unique<UploadRequest>(
        std::vector<char>(bytes_per_rank * size_t(size())), recv_data, *this);
    request->set_inner(host_->all_gather(input.data(), request->host_data(), bytes_per_rank));
    return request;  // the host group snapshots `input` at post
  }
  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    const size_t block = size_t(count_per_rank) * dtype_size(dtype);
    const std::vector<char> input = download(send_data, block * size_t(size()), "send");
    check_device_pointer(recv_data, block, "recv");
    auto request = std::make_unique<UploadRequest>(std::vector<char>(block), recv_data, *this);
    request->set_inner(
        host_->reduce_scatter(input.data(), request->host_data(), count_per_rank, dtype));
    return request;
  }
  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    const size_t bytes = bytes_per_rank * size_t(size());
    const std::vector<char> input = download(send_data, bytes, "send");
    check_device_pointer(recv_data, bytes, "recv");
    auto request = std::make_unique<UploadRequest>(std::vector<char>(bytes), recv_data, *this);
    request->set_inner(host_->all_to_all(input.data(), request->host_data(), bytes_per_rank));
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
  // Fails the group too, so that no other rank waits for this one until its deadline.
  void check(cudaError_t error, const std::string& what) const {
    if (error == cudaSuccess) return;
    cudaGetLastError();
    const std::string message = "in-process device communicator (rank " +
                                std::to_string(host_->rank()) + "): " + what + ": " +
                                cudaGetErrorName(error) + " " + cudaGetErrorString(error);
    control_.abort(message);
    throw Error(ErrorCode::kBackendFailure, "communicator", message);
  }

  // A buffer must be device memory of this communicator's device (a host pointer would be
  // copied as if it were one, silently).
  void check_device_pointer(const void* data, size_t bytes, const char* name) const {
    if (bytes == 0) return;
    cudaPointerAttributes attributes{};
    const cudaError_t error = cudaPointerGetAttributes(&attributes, data);
    if (error != cudaSuccess) cudaGetLastError();
    const bool on_device = error == cudaSuccess && (attributes.type == cudaMemoryTypeDevice ||
                                                    attributes.type == cudaMemoryTypeManaged);
    require(on_device && attributes.device == device_, name,
            "must be device memory on CUDA device " + std::to_string(device_));
  }

  // Device bytes -> a host buffer, after every operation ordered before the post.
  std::vector<char> download(const void* data, size_t bytes, const char* name) const {
    check_device_pointer(data, bytes, name);
    std::vector<char> host(bytes);
    if (bytes == 0) return host;
    const cuda::DeviceGuard guard(device_);
    check(cudaMemcpyAsync(host.data(), data, bytes, cudaMemcpyDeviceToHost, stream_),
          "copying an input to the host");
    check(cudaStreamSynchronize(stream_), "copying an input to the host");
    return host;
  }

  std::unique_ptr<Communicator> host_;
  int device_;
  GroupControl control_;
  cudaStream_t stream_ = nullptr;
};

void UploadRequest::wait() {
  if (done_) return;
  inner_->wait();
  comm_.upload(device_data_, host_.data(), host_.size());
  done_ = true;
}

}  // namespace

std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::unique_ptr<Communicator> host, int device, GroupControl control) {
  return std::make_unique<InProcessDeviceCommunicator>(std::move(host), device, std::move(control));
}

#else

std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::unique_ptr<Communicator>, int, GroupControl) {
  throw Error(ErrorCode::kNotSupported, "device",
              "dpa was built without CUDA: the in-process group has no device communicators");
}

#endif

}  // namespace dpa::cp
