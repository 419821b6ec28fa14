// Device buffers over a host communicator (include/dpa/cp.h, make_host_bounced_communicator):
// the device-buffer interface that context parallelism's device algorithms need, with every
// transfer bounced through host memory. The in-process group's device communicators are the
// same, over the rank's own host communicator and with the group's abort.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "dpa/cp.h"

namespace dpa::cp {

// What a bounced communicator asks of its group: fail it, and whether it has failed. Empty
// functions: the communicator fails only itself.
struct GroupControl {
  std::function<void(const std::string&)> abort;
  std::function<bool()> healthy;
};

// Owns `host`, the rank's communicator of the same group. Throws kNotSupported without CUDA.
std::unique_ptr<DeviceCommunicator> make_host_bounced_communicator(
    std::unique_ptr<Communicator> host, int device, GroupControl control);

}  // namespace dpa::cp
