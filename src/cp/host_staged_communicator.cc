// Host buffers over a device communicator (include/dpa/cp.h): each operation copies its host
// inputs into device memory on the communicator's stream, runs there, and copies its outputs
// back to the host when its wait() returns. Context parallelism's general algorithms exchange
// host buffers (docs/context_parallel.md), so this is what lets them run over NCCL and over the
// in-process group's device communicators; a copy in and out per message is the price.
#include <memory>
#include <string>
#include <utility>

#include "dpa/cp.h"
#include "dpa/error.h"

#if defined(DPA_WITH_CUDA)
#include <cuda_runtime.h>

#include "cuda/device_buffer.h"
#endif

namespace dpa {

#if defined(DPA_WITH_CUDA)

namespace {

Error staging_error(const std::string& what, cudaError_t error) {
  return Error(
      ErrorCode::kBackendFailure, "communicator",
      "host staging: " + what + ": " + cudaGetErrorName(error) + " " + cudaGetErrorString(error));
}

void check(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return;
  cudaGetLastError();  // clear it, so that a later launch check does not report it again
  throw staging_error(what, error);
}

// One staged operation: the inner handle, its device buffers, and where its output goes.
class StagedRequest final : public CommRequest {
 public:
  StagedRequest(CommHandle inner, std::unique_ptr<cuda::DeviceBuffer> input,
                std::unique_ptr<cuda::DeviceBuffer> output, void* host_output, size_t output_bytes)
      : input_(std::move(input)),
        output_(std::move(output)),
        host_output_(host_output),
        output_bytes_(output_bytes),
        inner_(std::move(inner)) {}

  // A finished operation releases its buffers first (while the communicator's stream surely
  // exists); an unfinished one aborts the communicator first, so that no queued operation is
  // left to run on released memory.
  ~StagedRequest() override {
    if (done_) {
      input_.reset();
      output_.reset();
    }
  }
  StagedRequest(const StagedRequest&) = delete;
  StagedRequest& operator=(const StagedRequest&) = delete;

  void wait() override {
    if (done_) return;
    inner_->wait();  // throws on failure, timeout or abort (the communicator is then aborted)
    if (host_output_ != nullptr && output_bytes_ > 0) {
      // The operation has completed (its event was reached): the device data is final.
      check(cudaMemcpy(host_output_, output_->get(), output_bytes_, cudaMemcpyDefault),
            "copying the result to the host");
    }
    done_ = true;
  }

 private:
  std::unique_ptr<cuda::DeviceBuffer> input_, output_;
  void* host_output_;
  size_t output_bytes_;
  bool done_ = false;
  // Declared last, destroyed first: an unfinished operation aborts the communicator before its
  // buffers are released (their release is stream-ordered after it as well).
  CommHandle inner_;
};

class HostStagedCommunicator final : public Communicator {
 public:
  explicit HostStagedCommunicator(DeviceCommunicator& inner)
      : inner_(inner), stream_(static_cast<cudaStream_t>(inner.stream())) {}

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }

  CommHandle send(const void* data, size_t bytes, int peer, int tag) override {
    auto input = upload(data, bytes);
    CommHandle inner = inner_.send(input->get(), bytes, peer, tag);
    return finish(std::move(inner), std::move(input), nullptr, nullptr, 0);
  }

  CommHandle recv(void* data, size_t bytes, int peer, int tag) override {
    auto output = stream_buffer(bytes);
    CommHandle inner = inner_.recv(output->get(), bytes, peer, tag);
    return finish(std::move(inner), nullptr, std::move(output), data, bytes);
  }

  CommHandle all_reduce(void* data, int64_t count, DType dtype) override {
    require(count >= 0, "count",
            [&] { return "must not be negative, got " + std::to_string(count); });
    const size_t bytes = size_t(count) * dtype_size(dtype);
    auto buffer = upload(data, bytes);
    void* device = buffer->get();
    CommHandle inner = inner_.all_reduce(device, count, dtype);
    return finish(std::move(inner), nullptr, std::move(buffer), data, bytes);
  }

  CommHandle all_gather(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    auto input = upload(send_data, bytes_per_rank);
    const size_t total = bytes_per_rank * size_t(size());
    auto output = stream_buffer(total);
    CommHandle inner = inner_.all_gather(input->get(), output->get(), bytes_per_rank);
    return finish(std::move(inner), std::move(input), std::move(output), recv_data, total);
  }

  CommHandle reduce_scatter(const void* send_data, void* recv_data, int64_t count_per_rank,
                            DType dtype) override {
    require(count_per_rank >= 0, "count_per_rank",
            [&] { return "must not be negative, got " + std::to_string(count_per_rank); });
    const size_t block = size_t(count_per_rank) * dtype_size(dtype);
    auto input = upload(send_data, block * size_t(size()));
    auto output = stream_buffer(block);
    CommHandle inner = inner_.reduce_scatter(input->get(), output->get(), count_per_rank, dtype);
    return finish(std::move(inner), std::move(input), std::move(output), recv_data, block);
  }

  CommHandle all_to_all(const void* send_data, void* recv_data, size_t bytes_per_rank) override {
    const size_t total = bytes_per_rank * size_t(size());
    auto input = upload(send_data, total);
    auto output = stream_buffer(total);
    CommHandle inner = inner_.all_to_all(input->get(), output->get(), bytes_per_rank);
    return finish(std::move(inner), std::move(input), std::move(output), recv_data, total);
  }

 private:
  // Device memory ordered on the communicator's stream (allocated and freed there), so it is
  // never released while an operation that uses it may still run.
  std::unique_ptr<cuda::DeviceBuffer> stream_buffer(size_t bytes) const {
    return std::make_unique<cuda::DeviceBuffer>(cuda::DeviceBuffer::stream_ordered(bytes, stream_));
  }

  // A device copy of `bytes` host bytes, ordered on the stream before the operation that reads
  // it. From pageable memory the copy may run synchronously (the caller keeps inputs unchanged
  // until wait() anyway, as every communicator requires). cudaMemcpyDefault also takes a device
  // pointer.
  std::unique_ptr<cuda::DeviceBuffer> upload(const void* data, size_t bytes) {
    auto buffer = stream_buffer(bytes);
    if (bytes > 0)
      check(cudaMemcpyAsync(buffer->get(), data, bytes, cudaMemcpyDefault, stream_),
            "copying the input to the device");
    return buffer;
  }

  static CommHandle finish(CommHandle inner, std::unique_ptr<cuda::DeviceBuffer> input,
                           std::unique_ptr<cuda::DeviceBuffer> output, void* host_output,
                           size_t output_bytes) {
    return std::make_unique<StagedRequest>(std::move(inner), std::move(input), std::move(output),
                                           host_output, output_bytes);
  }

  DeviceCommunicator& inner_;
  cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_staged_communicator(DeviceCommunicator& device_comm) {
  return std::make_unique<HostStagedCommunicator>(device_comm);
}

#else

std::unique_ptr<Communicator> make_host_staged_communicator(DeviceCommunicator&) {
  throw Error(ErrorCode::kNotSupported, "communicator",
              "dpa was built without CUDA: no device communicator exists to stage through");
}

#endif

}  // namespace dpa
