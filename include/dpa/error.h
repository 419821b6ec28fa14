// dpa::Error: every failure the library reports. Library code never exits or prints.
#pragma once

#include <stdexcept>
#include <string>

namespace dpa {

enum class ErrorCode : int {
  kInvalidArgument = 1,  // bad input; `argument()` names it
  kNotSupported = 2,     // no eligible backend, or a forced backend that is not eligible
  kBackendFailure = 3,   // a CUDA / cuBLAS / NCCL call failed
  kInternal = 4,         // a bug in dpa
  kIo = 5,               // file input/output (CLI helpers)
};

const char* to_string(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, const std::string& message)
      : std::runtime_error(compose(code, argument, message)),
        code_(code),
        argument_(std::move(argument)) {}

  ErrorCode code() const { return code_; }
  // The API name of the offending argument ("softcap", "softmax_offset", "q", ...), or empty.
  const std::string& argument() const { return argument_; }

 private:
  static std::string compose(ErrorCode code, const std::string& argument,
                             const std::string& message);
  ErrorCode code_;
  std::string argument_;
};

// Throws kInvalidArgument naming `argument` when `condition` is false.
inline void require(bool condition, const char* argument, const std::string& message) {
  if (!condition) throw Error(ErrorCode::kInvalidArgument, argument, message);
}

}  // namespace dpa
