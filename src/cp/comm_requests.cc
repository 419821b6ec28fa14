#include "cp/comm_requests.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace dpa::cp {

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& handle : handles) handle->wait();
  handles.clear();
}

Transfers::Transfers(Communicator& comm, bool device_buffers, void* stream)
    : stream_(stream), on_stream_(device_buffers && comm.device_communicator() != nullptr) {}

void Transfers::settle(std::vector<CommHandle>& handles) {
  if (!on_stream_) {
    wait_all(handles);
    return;
  }
  for (CommHandle& handle : handles) {
    handle->wait_on_stream(stream_);
    settled_.push_back(std::move(handle));
  }
  handles.clear();
}

void Transfers::finish() { wait_all(settled_); }

void Backoff::pause() {
  if (++polls_ < 256) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
}

}  // namespace dpa::cp
