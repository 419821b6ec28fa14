// The environment's part of a config, read once at the edge: DotProductAttention's and
// ContextParallelAttention's constructors call config_with_environment(config,
// process_environment()). Deeper code reads only the config, so an explicit config value wins
// over the environment and a test can inject its own getter (as nccl_bootstrap does).
//   DPA_BACKEND                fills config.backend when it is kAuto
//   DPA_FLASH_FORWARD_KERNEL   fills config.flash_forward_kernel when it is kAuto
//   DPA_FLASH_BACKWARD_KERNEL  fills config.flash_backward_kernel when it is kAuto
// An empty value counts as unset; an unknown name is an invalid-argument error naming the
// variable (never a silent fallback to auto).
#pragma once

#include <functional>

#include "dpa/config.h"

namespace dpa {

using EnvironmentGetter = std::function<const char*(const char* name)>;

EnvironmentGetter process_environment();  // std::getenv

AttentionConfig config_with_environment(AttentionConfig config, const EnvironmentGetter& getenv);

}  // namespace dpa
