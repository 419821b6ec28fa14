#!/usr/bin/env bash
# libFuzzer runs of the .npy reader, the CLI's argument parser (issue 15), the KV-cache call's
# validation (docs/kvcache.md) and the attention call on the host backends (validation, outputs
# untouched after an error, cpu against cpu_exact), under ASan and
# UBSan: builds build-fuzz with clang (CPU-only), then runs each harness for SECONDS (default
# 60) from the seed corpus in tests/fuzz/corpus with its dictionary. New inputs go to
# build-fuzz/corpus-NAME (the repository's seeds stay as they are). Exits non-zero when a
# harness finds a crash, a leak, a sanitizer report or a timeout; the reproducer is left in
# build-fuzz/ (crash-*, leak-*, timeout-*).
# usage: scripts/fuzz.sh [SECONDS]      DPA_JOBS: build jobs (default nproc)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build="$root/build-fuzz"
jobs="${DPA_JOBS:-$(nproc)}"
if ! command -v clang++ >/dev/null 2>&1; then
  echo "fuzz: clang++ not found; installing clang from Debian's packages" >&2
  apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=undefined"
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DDPA_CUDA=OFF -DDPA_TESTS=OFF \
  -DDPA_FUZZ=ON "-DCMAKE_CXX_FLAGS=$flags" "-DCMAKE_EXE_LINKER_FLAGS=$flags" >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_npy fuzz_cli_args fuzz_kvcache fuzz_attention >/dev/null
status=0
for name in npy cli_args kvcache attention; do
  corpus="$build/corpus-$name"
  mkdir -p "$corpus"
  echo "fuzz_$name: ${seconds}s"
  (cd "$build" && ASAN_OPTIONS=detect_leaks=1 "./tests/fuzz/fuzz_$name" "$corpus" \
    "$root/tests/fuzz/corpus/$name" "-dict=$root/tests/fuzz/$name.dict" \
    "-max_total_time=$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    2>"$build/fuzz_$name.log") || status=1
  grep -E "^(stat::number_of_executed_units|stat::new_units_added|SUMMARY|==[0-9]+==ERROR)" \
    "$build/fuzz_$name.log" || true
done
if [ "$status" -ne 0 ]; then
  echo "fuzz: a harness found something; see build-fuzz/fuzz_*.log and build-fuzz/crash-*" >&2
fi
exit "$status"
