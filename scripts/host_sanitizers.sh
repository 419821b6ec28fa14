#!/usr/bin/env bash
# Host sanitizers (run by scripts/test.sh, so in CI; about 4.5 minutes on 2 cores): the whole
# host suite under AddressSanitizer + UndefinedBehaviorSanitizer, and the multithreaded parts (context
# parallelism with in-process ranks, the cpu backend's thread pool) under ThreadSanitizer.
# CPU-only builds in build-asan and build-tsan. Exits non-zero when anything reports.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${DPA_JOBS:-$(nproc)}"
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi

build() {  # build DIR FLAGS
  cmake -S "$root" -B "$1" "${generator[@]}" -DDPA_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    "-DCMAKE_CXX_FLAGS=$2" "-DCMAKE_EXE_LINKER_FLAGS=$2" >/dev/null
  # Quiet when it builds; the whole build log when it does not (ninja prints errors on stdout).
  if ! cmake --build "$1" -j "$jobs" >"$1/build.log" 2>&1; then
    cat "$1/build.log"
    return 1
  fi
}

build "$root/build-asan" "-fsanitize=address,undefined -fno-sanitize-recover=undefined"
ASAN_OPTIONS=detect_leaks=1 "$root/build-asan/tests/dpa_tests" --gtest_brief=1

build "$root/build-tsan" "-fsanitize=thread"
TSAN_OPTIONS=halt_on_error=1 "$root/build-tsan/tests/dpa_tests" --gtest_brief=1 \
  --gtest_filter='CpuTiled.Concurrent*:CpComm*:CpFeatures.*:Cpu/CpMatchesExact.*causal_gqa*:Cpu/CpMatchesExact.*_cp8*_cpu:Cpu/CpMatchesExact.*a2a_p2p*_cpu'
echo "host_sanitizers: clean"
