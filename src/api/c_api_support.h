// What the C ABI's translation units share (c_api.cc, c_api_kvcache.cc): the thread's last error,
// the exception-to-status guard, and the translation of the tensor and call structs.
#pragma once

#include <string>

#include "dpa/arguments.h"
#include "dpa/c_api.h"
#include "dpa/error.h"
#include "dpa/tensor.h"

namespace dpa::c_api {

// The message of the last failed call on this thread (dpa_last_error).
std::string& last_error();

// Runs `fn`, turning any exception into a status and the thread's last error.
dpa_status_t status_of_current_exception();
template <typename Fn>
dpa_status_t guarded(Fn&& fn) {
  try {
    fn();
    return DPA_SUCCESS;  // the last error stays until the next failure, as with errno
  } catch (...) {
    return status_of_current_exception();
  }
}

// The stream and workspace of a call (NULL: the default stream, the driver's pool); errors name
// "call".
void apply_call(const dpa_call_t* call, void*& stream, Workspace& workspace);

// A dpa_tensor_t as a view; ndim 0 with no data is an absent tensor. Errors name `name`.
TensorView to_view(const dpa_tensor_t& t, const char* name);

}  // namespace dpa::c_api
