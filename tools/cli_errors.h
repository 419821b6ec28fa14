// How the dpa tool reports failures: exit statuses, and the mapping from the library's
// argument names ("softmax_offset") to the flags a user typed ("--softmax-offset").
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace dpa::cli {

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;  // a backend, I/O-on-output or internal failure
constexpr int kExitUsage = 2;    // bad flags or invalid input (nothing was written)

// Maps a library argument name to a flag name without dashes, or "" when no flag matches.
using FlagNamer = std::function<std::string(std::string_view api_argument)>;

// `dpa attention`: input tensors are named by the flag that gave their file.
std::string attention_flag(std::string_view api_argument);
// `dpa explain`: tensors come from --shape-q etc.
std::string explain_flag(std::string_view api_argument);
// `dpa cp-check`: tensors come from --heads, --kv-heads, --seqlen ...
std::string cp_check_flag(std::string_view api_argument);

// Runs `body` and turns every exception into a message on stderr and an exit status:
//   dpa <command>: error: --flag: message
// stdout is never written on error.
int run_guarded(std::string_view command, const FlagNamer& namer, const std::function<int()>& body);

}  // namespace dpa::cli
