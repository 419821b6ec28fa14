// What core needs of a device, declared here and implemented by the CUDA layer (DESIGN.md §1:
// core includes only core and the public headers). The composition root (src/api/registry.cc)
// provides the implementation of this build, or none without CUDA.
#pragma once

#include <cstddef>

namespace dpa {

class DeviceAccess {
 public:
  virtual ~DeviceAccess() = default;
  // The compute capability of `device_index` as major * 10 + minor (90 for sm_90); 0 when
  // there is no such device.
  virtual int arch(int device_index) const = 0;
  // Copies `bytes` from device memory to the host, ordered on `stream` (a cudaStream_t), and
  // waits for the copy.
  virtual void copy_to_host(void* host_destination, const void* device_source, size_t bytes,
                            void* stream) const = 0;
};

// This build's device access; nullptr when it was built without CUDA.
const DeviceAccess* device_access();

}  // namespace dpa
