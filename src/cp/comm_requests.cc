#include "cp/comm_requests.h"

#include <algorithm>
#include <thread>

namespace dpa::cp {

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& handle : handles) handle->wait();
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
