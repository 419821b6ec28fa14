#!/usr/bin/env bash
# The test command: the layers' include direction (scripts/check_layers.sh), build, then every
# test through CTest (GPU suites skip without a GPU); the
# Python package, built and installed into a virtual environment and tested with pytest
# (scripts/python_test.sh); the host suite under ASan + UBSan and TSan
# (scripts/host_sanitizers.sh); and a short libFuzzer run of the .npy reader and the CLI's
# argument parser (scripts/fuzz.sh). Switches: DPA_PYTHON_TESTS=0, DPA_SANITIZERS=0 and
# DPA_FUZZ_SECONDS=0 skip those parts (DPA_FUZZ_SECONDS sets each harness's time, default 60).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/check_layers.sh"
"$root/scripts/build.sh"
ctest --test-dir "${DPA_BUILD_DIR:-$root/build}" --output-on-failure -j "${DPA_JOBS:-$(nproc)}" "$@"
if [ "${DPA_PYTHON_TESTS:-1}" != "0" ]; then
  "$root/scripts/python_test.sh"
fi
if [ "${DPA_SANITIZERS:-1}" != "0" ]; then
  "$root/scripts/host_sanitizers.sh"
fi
if [ "${DPA_FUZZ_SECONDS:-60}" != "0" ]; then
  "$root/scripts/fuzz.sh" "${DPA_FUZZ_SECONDS:-60}"
fi
