#!/usr/bin/env bash
# The test command: build, then every test through CTest. GPU suites skip without a GPU.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
ctest --test-dir "${DPA_BUILD_DIR:-$root/build}" --output-on-failure -j "${DPA_JOBS:-$(nproc)}" "$@"
