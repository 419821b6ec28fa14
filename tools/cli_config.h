// The attention configuration flags shared by `dpa attention` and `dpa explain`.
#pragma once

#include <vector>

#include "cli_args.h"
#include "dpa/config.h"

namespace dpa::cli {

// The names the enum flags take, for their error messages (ParsedArgs::get_named).
inline constexpr const char* kMaskChoices =
    "no_mask, padding, causal, padding_causal, causal_bottom_right, "
    "padding_causal_bottom_right, arbitrary";
inline constexpr const char* kSoftmaxTypeChoices = "vanilla, off-by-one, learnable";
inline constexpr const char* kBackendChoices = "cpu_exact, cpu, cuda_unfused, cuda_flash, auto";

// --format --mask --window --bottom-right-diagonal --softcap --scale --softmax-type
// --bias-type --dropout --seed --offset --deterministic --layer-number --backend
std::vector<FlagSpec> config_flag_specs();

// Builds the AttentionConfig those flags describe. Names, numbers and lists are parsed here
// (UsageError naming the flag); value ranges (negative cap, dropout >= 1, ...) are left to the
// library's validation so that the CLI and the API refuse exactly the same inputs.
// `has_softmax_offset`: an offset tensor was given, so --softmax-type defaults to learnable.
// `has_bias`: a bias tensor was given, so --bias-type defaults to post_scale.
AttentionConfig parse_config(const ParsedArgs& args, bool has_softmax_offset, bool has_bias);

// The dropout RNG state of --seed / --offset (both default to 0).
RngState parse_rng(const ParsedArgs& args);

}  // namespace dpa::cli
