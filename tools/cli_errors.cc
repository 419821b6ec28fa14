#include "cli_errors.h"

#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <set>

#include "cli_args.h"
#include "dpa/error.h"

namespace dpa::cli {

namespace {

// The library's names are C++ identifiers; flags spell them with hyphens.
std::string hyphenated(std::string_view name) {
  std::string flag(name);
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// Library arguments whose flag is not simply the hyphenated name, common to both commands.
const std::map<std::string, std::string, std::less<>>& shared_aliases() {
  static const std::map<std::string, std::string, std::less<>> aliases = {
      {"window_left", "window"}, {"window_right", "window"},
      {"window", "window"},      {"mask_type", "mask"},
      {"rng", "seed"},           {"rng_offset", "offset"},
      {"dropout_p", "dropout"},
  };
  return aliases;
}

const std::set<std::string, std::less<>>& config_flags() {
  static const std::set<std::string, std::less<>> flags = {
      "format",       "mask",    "window",       "bottom-right-diagonal",
      "softcap",      "scale",   "softmax-type", "bias-type",
      "dropout",      "seed",    "offset",       "deterministic",
      "layer-number", "backend",
  };
  return flags;
}

std::string map_name(std::string_view api_argument,
                     const std::map<std::string, std::string, std::less<>>& own_aliases,
                     const std::set<std::string, std::less<>>& own_flags) {
  if (api_argument.empty()) return "";
  if (auto it = own_aliases.find(api_argument); it != own_aliases.end()) return it->second;
  if (auto it = shared_aliases().find(api_argument); it != shared_aliases().end()) {
    return it->second;
  }
  std::string flag = hyphenated(api_argument);
  if (config_flags().count(flag) || own_flags.count(flag)) return flag;
  return "";
}

void print_error(std::string_view command, const std::string& flag, const std::string& message) {
  std::cerr << "dpa " << command << ": error: ";
  if (!flag.empty()) std::cerr << "--" << flag << ": ";
  std::cerr << message << std::endl;
}

}  // namespace

std::string attention_flag(std::string_view api_argument) {
  static const std::map<std::string, std::string, std::less<>> aliases = {
      // Gradient buffers are allocated from the inputs they mirror.
      {"dq", "q"},
      {"dk", "k"},
      {"dv", "v"},
      {"d_o", "do"},
      {"dO", "do"},
      {"dbias", "bias"},
      {"dsoftmax_offset", "softmax-offset"},
      {"cu_seqlens", "cu-seqlens-q"},  // a sequence table of either side
  };
  static const std::set<std::string, std::less<>> flags = {
      "q",
      "k",
      "v",
      "do",
      "out",
      "cu-seqlens-q",
      "cu-seqlens-kv",
      "cu-seqlens-q-padded",
      "cu-seqlens-kv-padded",
      "attn-mask",
      "bias",
      "alibi-slopes",
      "softmax-offset",
  };
  return map_name(api_argument, aliases, flags);
}

std::string explain_flag(std::string_view api_argument) {
  static const std::map<std::string, std::string, std::less<>> aliases = {
      {"q", "shape-q"},
      {"k", "shape-k"},
      {"v", "shape-v"},
      {"bias", "bias-shape"},
      {"dbias", "bias-shape"},
      {"softmax_offset", "has-softmax-offset"},
      {"dsoftmax_offset", "has-softmax-offset"},
      {"alibi_slopes", "has-alibi-slopes"},
      {"attn_mask", "mask-shape"},
      {"cu_seqlens", "batch"},
      {"cu_seqlens_q", "batch"},
      {"cu_seqlens_kv", "batch"},
      {"cu_seqlens_q_padded", "has-padded-offsets"},
      {"cu_seqlens_kv_padded", "has-padded-offsets"},
      {"dtype", "dtype"},
      {"device", "device"},
  };
  static const std::set<std::string, std::less<>> flags = {};
  return map_name(api_argument, aliases, flags);
}

std::string cp_check_flag(std::string_view api_argument) {
  // cp-check generates its tensors from shape flags: a tensor's error names the shape, the
  // bias and sink flags name themselves, and the CP ones theirs.
  static const std::map<std::string, std::string, std::less<>> aliases = {
      {"q", "heads"},         {"k", "kv-heads"}, {"v", "kv-heads"},
      {"bias", "bias"},       {"dbias", "bias"}, {"attn_mask", "mask-density"},
      {"communicator", "cp"}, {"cp", "cp"},      {"a2a_group_size", "a2a-group"},
      {"comm_type", "comm"},
  };
  static const std::set<std::string, std::less<>> flags = {"cp", "comm", "seqlen", "tolerance"};
  return map_name(api_argument, aliases, flags);
}

int run_guarded(std::string_view command, const FlagNamer& namer,
                const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    // The message already says which flag (e.g. "--softcap expects a number").
    print_error(command, "", e.what());
    return kExitUsage;
  } catch (const Error& e) {
    // what() already carries the API name, e.g. "dpa invalid argument (softcap): ...".
    print_error(command, namer(e.argument()), e.what());
    switch (e.code()) {
      case ErrorCode::kInvalidArgument:
        return kExitUsage;
      // Input files are named by a flag; output files are not.
      case ErrorCode::kIo:
        return e.argument().empty() ? kExitFailure : kExitUsage;
      case ErrorCode::kNotSupported:
      case ErrorCode::kBackendFailure:
      case ErrorCode::kInternal:
        return kExitFailure;
    }
    return kExitFailure;
  } catch (const std::exception& e) {
    print_error(command, "", e.what());
    return kExitFailure;
  }
}

}  // namespace dpa::cli
