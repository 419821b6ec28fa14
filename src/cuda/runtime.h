// Host-side CUDA runtime helpers that core code may call (no CUDA headers here, so core stays
// compilable without the toolkit's includes). Only built when DPA_WITH_CUDA is defined.
#pragma once

#include <cstddef>
#include <string>

namespace dpa::cuda {

struct DeviceInfo {
  bool present = false;
  int arch = 0;  // major * 10 + minor, e.g. 90
  int sm_count = 0;
  size_t shared_memory_per_block_optin = 0;
  size_t l2_bytes = 0;
  std::string name;
};

// Cached per device; `present` is false when there is no such device (or no driver).
const DeviceInfo& device_info(int device_index);

// Free device memory now (bytes); 0 when unknown.
size_t free_device_memory(int device_index);

// Whether `pointer` is device memory of `device_index`, or managed memory: what the device
// communicators take as buffers (a host pointer would fault in a copy or a kernel, or silently
// take a slow path). False for host memory and unknown pointers.
bool is_device_memory_of(const void* pointer, int device_index);

// Whether `stream` (a cudaStream_t) is capturing a CUDA graph. Asked before any call that a
// capturing stream refuses or that a graph would replay wrongly.
bool stream_is_capturing(void* stream);

// Synchronous copy of `bytes` from device memory to the host, ordered after `stream`'s work.
// Throws kNotSupported naming "stream" while the stream captures a CUDA graph.
void copy_to_host(void* host_destination, const void* device_source, size_t bytes, void* stream);

// Makes `device_index` current for the scope and restores the previous device after. Declare
// it before any device buffer so that buffers are released while the device is still current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  int current_ = -1;
};

// Device memory allocated on `device_index` (cudaMalloc) and freed on destruction: the one owner
// of synchronous allocations (host-staged CP, the CP ring's workspace, the CLI, the benches
// and the GPU tests). Stream-ordered and caller-workspace buffers are DeviceBuffer
// (device_buffer.h). Zero bytes allocate nothing.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  DeviceMemory(size_t bytes, int device_index);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return data_; }

 private:
  void* data_ = nullptr;
  int device_ = 0;
};

// Copies between the host and memory of `device_index`, ordered after the work of the legacy
// default stream (the stream the staged calls use). Device to host is synchronous; host to
// device from pageable memory may return before the data lands (later legacy-stream work still
// sees it; other streams need synchronize(nullptr, device) first). They, DeviceMemory and
// synchronize() leave the calling thread's current device as they found it.
void copy_host_to_device(void* device_destination, const void* host_source, size_t bytes,
                         int device_index);
void copy_device_to_host(void* host_destination, const void* device_source, size_t bytes,
                         int device_index);

// Sets `bytes` bytes of device memory to `value` (ordered on the legacy default stream).
void fill_device_bytes(void* device_destination, int value, size_t bytes, int device_index);

// Waits for `stream` (a cudaStream_t; nullptr: the legacy default stream) on `device_index`.
void synchronize(void* stream, int device_index);

// A point in a stream's work (a CUDA event recorded there when constructed): the host can ask
// whether the device has run past it without waiting, and another stream can wait for it.
class StreamPoint {
 public:
  StreamPoint(void* stream, int device_index);
  ~StreamPoint();
  StreamPoint(const StreamPoint&) = delete;
  StreamPoint& operator=(const StreamPoint&) = delete;
  // Whether every piece of work enqueued on the stream before the point has completed; never
  // blocks. A failed stream throws.
  bool reached() const;
  // Work enqueued on `stream` (of the same device) from now on runs after the point.
  void order(void* stream) const;
  // Blocks until the device has run past the point.
  void wait() const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = 0;
};

}  // namespace dpa::cuda
