#!/usr/bin/env bash
# Configures and builds dpa into ${DPA_BUILD_DIR:-build}. Extra arguments go to cmake.
# Needs only what a fresh machine has: g++, cmake, GoogleTest (and nvcc for the CUDA parts).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DPA_BUILD_DIR:-$root/build}"
jobs="${DPA_JOBS:-$(nproc)}"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
elif [ $# -gt 0 ]; then
  cmake -S "$root" -B "$build_dir" "$@"
fi
cmake --build "$build_dir" -j "$jobs"
