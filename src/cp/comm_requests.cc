#include "cp/comm_requests.h"

namespace dpa::cp {

void wait_all(std::vector<CommHandle>& handles) {
  for (CommHandle& handle : handles) handle->wait();
  handles.clear();
}

}  // namespace dpa::cp
