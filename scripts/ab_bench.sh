#!/usr/bin/env bash
# A/B timing on the GPU machine, both builds in one call (docs/perf.md's rule: ours against ours
# only in the same call, by the same method): builds `dpa` from this tree ("new", in the build
# directory scripts/gpu_check.sh uses) and from a copy of the tree with PATCH reversed ("base",
# in /tmp/dpa-ab-base, built in the background while the caller's other steps run), then times
# every row of ROWS with `dpa bench` in interleaved rounds (scripts/bench_common.sh,
# bench_rounds: base, new, base, ..., base) and prints one table: each build's median time
# (min-max), base / new (> 1: the change is faster) with its range over the rounds.
#
# usage: scripts/ab_bench.sh OUTDIR PATCH ROWS
#   PATCH  the change under test as a patch against the base (here: `git diff BASE -- src include
#          > .device/ab.patch`, then carry .device)
#   ROWS   one `dpa bench` argument list per line (e.g. `--pass bwd --shapes
#          2,16,16,8192,8192,128 --causal`); `#` starts a comment
#
# Environment: DPA_BUILD_DIR (default build-device), DPA_CUDA_ARCHS (default 90a), DPA_JOBS
# (default 16), AB_BASE_ROOT (default /tmp/dpa-ab-base: give each patch its own when one call
# times two changes against the same new tree), DPA_BENCH_ROUNDS (default 3: rounds per row).
# AB_START_BASE=1: only start the base build in the background and return, so that
# it runs under the caller's other steps (the GPU suite); a later call without it waits for
# that build instead of starting one.
# Writes OUTDIR/ab.md (the table and the commands) and OUTDIR/ab.log.
set -uo pipefail

if [ $# -ne 3 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
patch_file="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
rows_file="$(cd "$(dirname "$3")" && pwd)/$(basename "$3")"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bench_common.sh
source "$root/scripts/bench_common.sh"
build="${DPA_BUILD_DIR:-$root/build-device}"
archs="${DPA_CUDA_ARCHS:-90a}"
jobs="${DPA_JOBS:-16}"
rounds="${DPA_BENCH_ROUNDS:-3}"
base_root="${AB_BASE_ROOT:-/tmp/dpa-ab-base}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/ab.log"

build_base() {
  rm -rf "$base_root" "$base_root.done" && mkdir -p "$base_root"
  (cd "$root" && tar --exclude='./build*' --exclude=./.device --exclude=./.git -cf - .) |
    tar -xf - -C "$base_root"
  (cd "$base_root" && patch -s -R -p1 <"$patch_file") &&
    cmake -S "$base_root" -B "$base_root/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      "-DCMAKE_CUDA_ARCHITECTURES=$archs" -DDPA_TESTS=OFF >"$base_root.log" 2>&1 &&
    ninja -C "$base_root/build" -j "$jobs" dpa_cli >>"$base_root.log" 2>&1
  echo "base build rc=$?" >"$base_root.done"
}

if [ "${AB_START_BASE:-0}" = 1 ]; then
  build_base </dev/null >/dev/null 2>&1 &
  echo "ab_bench: the base build runs in the background (log $base_root.log)"
  exit 0
fi
: >"$log"
[ -d "$base_root" ] || build_base &
if [ ! -x "$build/tools/dpa" ]; then
  DPA_CUDA_ARCHS="$archs" DPA_JOBS="$jobs" bash "$root/scripts/gpu_check.sh" "$out/check" build
fi
for _ in $(seq 600); do
  [ -f "$base_root.done" ] && break
  sleep 1
done
cat "$base_root.done" >>"$log" 2>/dev/null || echo "base build unfinished after 600 s" >>"$log"
new="$build/tools/dpa"
base="$base_root/build/tools/dpa"
for binary in "$new" "$base"; do
  if [ ! -x "$binary" ]; then
    echo "ab_bench: no $binary (see $log and $base_root.log)" | tee -a "$log" >&2
    exit 1
  fi
done

{
  echo "# A/B: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
    head -1);" \
    "new = $(tr '\n' ' ' <"$root/.device/commit" 2>/dev/null)"
  echo
  echo "| dpa bench arguments | base ms | new ms | base / new |"
  echo "|---|---|---|---|"
  while IFS= read -r line; do
    echo "| \`$line\` $(bench_rounds "$log" "$rounds" "$line" "$base" "$new")"
  done < <(bench_rows "$rows_file")
} | tee "$out/ab.md"
