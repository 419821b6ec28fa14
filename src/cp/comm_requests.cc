#include "cp/comm_requests.h"

#include <algorithm>
#include <thread>
#include <utility>

namespace dpa::cp {

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& handle : handles) handle->wait();
  handles.clear();
}

void order_stream_after(std::vector<CommHandle>& handles, void* stream,
                        std::vector<CommHandle>& waited_later) {
  for (CommHandle& handle : handles) {
    handle->wait_on_stream(stream);
    waited_later.push_back(std::move(handle));
  }
  handles.clear();
}

void Backoff::pause() {
  if (++polls_ < 256) {
    std::this_thread::yield();
    return;
  }
  std::this_thread::sleep_for(sleep_);
  sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
}

}  // namespace dpa::cp
