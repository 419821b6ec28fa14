#!/usr/bin/env bash
# One device call that asks which change makes a GPU test fail. Each TREE is this tree plus a
# comma-separated list of patches ('-' for none); for each in turn it applies the patches,
# rebuilds, runs the GPU tests over FILTER REPEAT times, and takes the patches back out. The first
# tree whose runs fail is then run once under CUDA_LAUNCH_BLOCKING=1 (the error surfaces at the
# faulting launch, not at a later download) and once under compute-sanitizer memcheck (which names
# the kernel and the instruction). Prints one line per tree.
#
# usage: scripts/patch_stack_check.sh OUTDIR FILTER REPEAT TREE [TREE ...]
#   e.g. scripts/patch_stack_check.sh $OUT/stack 'FlashRandomized.*' 3 - .device/a.patch \
#          .device/a.patch,.device/b.patch
#
# Environment: DPA_BUILD_DIR (default build-device), DPA_CUDA_ARCHS (default 90a), DPA_JOBS
# (default 16), STACK_STEP_TIMEOUT_S (default 240: the limit on each build and each test run).
# The tree must be clean of the patches when it starts; a patch that does not apply stops the run.
set -uo pipefail

if [ $# -lt 4 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
filter="$2"
repeat="$3"
shift 3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPA_BUILD_DIR:-$root/build-device}"
archs="${DPA_CUDA_ARCHS:-90a}"
jobs="${DPA_JOBS:-16}"
step_timeout="${STACK_STEP_TIMEOUT_S:-240}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
tests="$build/tests/dpa_gpu_tests"

configure() {
  local args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CUDA_ARCHITECTURES=$archs")
  if [ -d "$root/.device/googletest" ]; then
    args+=("-DDPA_GTEST_SOURCE_DIR=$root/.device/googletest")
  fi
  cmake "${args[@]}" >"$out/configure.log" 2>&1
}

# Applies (or, with -R, takes back in reverse order) the comma-separated patches of a tree.
apply_tree() {
  local tree="$1" direction="${2:-}" patches=() i
  [ "$tree" = "-" ] && return 0
  IFS=',' read -r -a patches <<<"$tree"
  if [ "$direction" = "-R" ]; then
    for ((i = ${#patches[@]} - 1; i >= 0; i--)); do
      (cd "$root" && git apply -R "${patches[$i]}") || return 1
    done
  else
    for i in "${!patches[@]}"; do
      (cd "$root" && git apply "${patches[$i]}") || return 1
    done
  fi
}

# Runs the filter TIMES times under the given prefix command; prints "passed/failed" counts of test runs and the first failure.
run_tests() {
  local log="$1" times="$2" passed failed
  shift 2
  timeout "$step_timeout" "$@" "$tests" --gtest_filter="$filter" --gtest_repeat="$times" \
    >"$log" 2>&1
  passed=$(grep -c '^\[       OK \]' "$log")
  failed=$(grep -c '^\[  FAILED  \] [A-Za-z].*(' "$log")
  echo "passed $passed, failed $failed; $(grep -m1 -o 'an illegal [a-z ]*\|CUDA error[^;]*\|Invalid __[a-z]* [a-z]*' "$log" || true)"
}

configure || {
  echo "patch_stack_check: cmake failed (see $out/configure.log)"
  exit 1
}
first_failing=""
for n in $(seq 1 $#); do
  tree="${!n}"
  if ! apply_tree "$tree"; then
    echo "tree $n ($tree): a patch does not apply"
    exit 1
  fi
  t0=$(date +%s)
  if timeout "$step_timeout" ninja -C "$build" -j "$jobs" dpa_gpu_tests dpa_cli \
    >"$out/build$n.log" 2>&1; then
    result=$(run_tests "$out/tree$n.log" "$repeat" env)
    echo "tree $n ($tree): built in $(($(date +%s) - t0)) s; $result"
    if [ -z "$first_failing" ] && ! grep -q 'failed 0;' <<<"$result"; then
      first_failing="$n"
      result=$(run_tests "$out/tree${n}_blocking.log" 1 env CUDA_LAUNCH_BLOCKING=1)
      echo "tree $n, launch blocking: $result"
      result=$(run_tests "$out/tree${n}_memcheck.log" 1 compute-sanitizer --tool memcheck)
      echo "tree $n, memcheck: $result"
      grep -m3 -A4 'Invalid\|illegal\|Error' "$out/tree${n}_memcheck.log" || true
    fi
  else
    echo "tree $n ($tree): build failed (see build$n.log)"
    tail -n 20 "$out/build$n.log"
  fi
  apply_tree "$tree" -R || {
    echo "tree $n ($tree): could not take the patches back out"
    exit 1
  }
done
