#!/usr/bin/env bash
# The test command: build, then every test through CTest (GPU suites skip without a GPU), then
# the Python package: built and installed into a virtual environment and tested with pytest
# (scripts/python_test.sh; DPA_PYTHON_TESTS=0 skips it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
ctest --test-dir "${DPA_BUILD_DIR:-$root/build}" --output-on-failure -j "${DPA_JOBS:-$(nproc)}" "$@"
if [ "${DPA_PYTHON_TESTS:-1}" != "0" ]; then
  "$root/scripts/python_test.sh"
fi
