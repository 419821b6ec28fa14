// dpa::Error: every failure the library reports. Library code never exits or prints.
#pragma once

#include <stdexcept>
#include <string>
#include <type_traits>

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

// Throws kInvalidArgument naming `argument` when `condition` is false. Every call validates
// tens of arguments, so the message is built only on failure: a literal, or a callable that
// returns the message (`[&] { return "has " + str(n) + " rows"; }`) where it is composed.
inline void require(bool condition, const char* argument, const char* message) {
  if (!condition) throw Error(ErrorCode::kInvalidArgument, argument, message);
}
inline void require(bool condition, const char* argument, const std::string& message) {
  if (!condition) throw Error(ErrorCode::kInvalidArgument, argument, message);
}
// (enable_if, not a requires-clause: CUDA translation units include this header as C++17.)
template <typename MakeMessage,
          typename = std::enable_if_t<std::is_invocable_r_v<std::string, MakeMessage>>>
void require(bool condition, const char* argument, MakeMessage&& make_message) {
  if (!condition) throw Error(ErrorCode::kInvalidArgument, argument, make_message());
}

}  // namespace dpa
