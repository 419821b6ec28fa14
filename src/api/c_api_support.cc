#include "api/c_api_support.h"

#include <exception>
#include <string>

namespace dpa::c_api {
namespace {

dpa_status_t status_of(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return DPA_INVALID_ARGUMENT;
    case ErrorCode::kNotSupported:
      return DPA_NOT_SUPPORTED;
    case ErrorCode::kBackendFailure:
      return DPA_BACKEND_FAILURE;
    case ErrorCode::kInternal:
      return DPA_INTERNAL_ERROR;
    case ErrorCode::kIo:
      return DPA_IO_ERROR;
  }
  return DPA_INTERNAL_ERROR;
}

}  // namespace

std::string& last_error() {
  thread_local std::string message;
  return message;
}

dpa_status_t status_of_current_exception() {
  try {
    throw;
  } catch (const Error& error) {
    last_error() = error.what();
    return status_of(error.code());
  } catch (const std::exception& error) {
    last_error() = std::string("dpa internal error: ") + error.what();
    return DPA_INTERNAL_ERROR;
  } catch (...) {
    last_error() = "dpa internal error: unknown exception";
    return DPA_INTERNAL_ERROR;
  }
}

TensorView to_view(const dpa_tensor_t& t, const char* name) {
  TensorView view;
  if (t.ndim == 0 && t.data == nullptr) return view;
  require(t.ndim > 0 && t.ndim <= kMaxDims, name, "must have 1 to 5 dimensions");
  require(t.dtype >= 0 && t.dtype <= 5, name, "has an unknown dtype");
  require(t.device == 0 || t.device == 1, name, "has an unknown device");
  view.data = t.data;
  view.dtype = static_cast<DType>(t.dtype);
  view.device = static_cast<Device>(t.device);
  view.device_index = t.device_index;
  view.ndim = t.ndim;
  for (int d = 0; d < t.ndim; ++d) {
    view.shape[size_t(d)] = t.shape[d];
    view.strides[size_t(d)] = t.strides[d];
  }
  return view;
}

// The stream and workspace of a call (NULL: the default stream, the driver's pool).
void apply_call(const dpa_call_t* call, void*& stream, Workspace& workspace) {
  if (call == nullptr) return;
  // A newer caller's larger struct is accepted: its fields start with ours.
  require(call->size >= sizeof(dpa_call_t), "call", [&] {
    return "has size " + std::to_string(call->size) +
           ", expected at least sizeof(dpa_call_t) = " + std::to_string(sizeof(dpa_call_t));
  });
  require(call->workspace != nullptr || call->workspace_bytes == 0, "call",
          "has workspace_bytes but no workspace");
  stream = call->stream;
  workspace.data = call->workspace;
  workspace.bytes = call->workspace_bytes;
}

}  // namespace dpa::c_api
