#include "core/environment.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "dpa/error.h"

namespace dpa {
namespace {

// Fills `field` from variable `name` when the field is still kAuto.
template <typename Enum, typename Parse>
void fill_from(Enum& field, const EnvironmentGetter& getenv, const char* name, Parse parse,
               const char* known) {
  const char* text = getenv(name);
  if (text == nullptr || *text == '\0') return;
  const std::optional<Enum> value = parse(std::string_view(text));
  if (!value)
    throw Error(ErrorCode::kInvalidArgument, name,
                std::string("unknown name '") + text + "' (known: " + known + ")");
  if (field == Enum::kAuto) field = *value;
}

}  // namespace

EnvironmentGetter process_environment() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

AttentionConfig config_with_environment(AttentionConfig config, const EnvironmentGetter& getenv) {
  fill_from(config.backend, getenv, "DPA_BACKEND", parse_backend,
            "auto, cpu_exact, cpu, cuda_unfused, cuda_flash");
  fill_from(config.flash_forward_kernel, getenv, "DPA_FLASH_FORWARD_KERNEL",
            parse_flash_forward_kernel, "auto, mma_sync, wgmma_ws");
  fill_from(config.flash_backward_kernel, getenv, "DPA_FLASH_BACKWARD_KERNEL",
            parse_flash_backward_kernel, "auto, mma_sync, one_kernel");
  return config;
}

}  // namespace dpa
