// Helpers over Communicator handles shared by every CP algorithm (cp_attention.cc and the
// device ring), so that neither includes the other.
#pragma once

#include <vector>

#include "dpa/cp.h"

namespace dpa::cp {

// Waits for every handle, then empties the list.
void wait_all(std::vector<CommHandle>& handles);

}  // namespace dpa::cp
