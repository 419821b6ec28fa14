// The in-process group's device communicators (include/dpa/cp.h,
// InProcessGroup::device_communicator): a rank's host communicator with device buffers at its
// boundary. Kept apart from in_process.cc, which needs no CUDA.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dpa/cp.h"

namespace dpa::cp {

// What a device communicator asks of its group: fail it, and whether it has failed.
struct GroupControl {
  std::function<void(const std::string&)> abort;
  std::function<bool()> healthy;
};

// `host`: the rank's communicator of the same group. Throws kNotSupported without CUDA.
std::unique_ptr<DeviceCommunicator> make_in_process_device_communicator(
    std::unique_ptr<Communicator> host, int device, GroupControl control);

}  // namespace dpa::cp
