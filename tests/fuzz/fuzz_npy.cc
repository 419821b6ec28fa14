// libFuzzer harness for the .npy reader (tools/npy.h): any byte string is either decoded or
// refused with dpa::Error. A crash, a sanitizer report, a hang or any other exception (a bare
// bad_alloc, say) is a finding. scripts/fuzz.sh runs it; docs/hardening.md says how long.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "dpa/error.h"
#include "npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    dpa::npy::Array array =
        dpa::npy::decode(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npy");
    // A decoded array must be usable as a view (the CLI's next step).
    (void)array.view();
  } catch (const dpa::Error&) {
  }
  return 0;
}
