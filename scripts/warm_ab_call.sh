#!/usr/bin/env bash
# A follow-up device call for a kernel change, on a machine that an earlier call left warm with
# build-device/ built (scripts/ab_call.sh): rebuilds build-device incrementally, runs the GPU
# tests that FILTER selects (sharded over the cores, as scripts/gpu_check.sh's suite is), the A/B
# of PATCH against the tree without it over ROWS (scripts/ab_bench.sh, the base built in the
# background meanwhile), then compute-sanitizer racecheck, synccheck and memcheck over
# SANITIZE_FILTER with the time left. For a change that touches a few kernels, where the whole
# suite already passed on the tree without it in the same session.
#
# usage: scripts/warm_ab_call.sh OUTDIR PATCH ROWS FILTER SANITIZE_FILTER
#
# Environment: WARM_DEADLINE_S (default 400: seconds from the start after which the sanitizers
# get no time; the tests stop at 60% of it), DPA_CUDA_ARCHS (default 90a, as ab_call.sh's).
# Writes OUTDIR/ab/ (ab.md, ab.log) and OUTDIR/logs.tar.gz (the build's summary, the test shards'
# and the sanitizers' logs: the device tool returns 8 files at most) and prints the summaries.
set -uo pipefail

if [ $# -ne 5 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1" patch_file="$2" rows="$3" filter="$4" sanitize_filter="$5"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deadline="${WARM_DEADLINE_S:-400}"
export DPA_CUDA_ARCHS="${DPA_CUDA_ARCHS:-90a}" DPA_CHECK_FAMILIES=""
mkdir -p "$out"
out="$(cd "$out" && pwd)"
logs="$(mktemp -d)"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
tests="$root/build-device/tests/dpa_gpu_tests"

AB_BASE_ROOT=/tmp/dpa-warm-base AB_START_BASE=1 bash "$root/scripts/ab_bench.sh" "$out/ab" \
  "$patch_file" "$rows"
bash "$root/scripts/gpu_check.sh" "$logs/check" build >/dev/null
grep -i "build" "$logs/check/summary.txt"
echo "warm_ab_call: built at $(elapsed) s"

shards=4
test_budget=$((deadline * 6 / 10 - $(elapsed)))
for shard in $(seq 0 $((shards - 1))); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$shard timeout "$test_budget" "$tests" \
    --gtest_filter="$filter" >"$logs/tests_shard$shard.log" 2>&1 &
done
wait
for shard in $(seq 0 $((shards - 1))); do
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests? ran" "$logs/tests_shard$shard.log" |
    sed "s/^/shard $shard: /"
done
echo "warm_ab_call: tests done at $(elapsed) s"

AB_BASE_ROOT=/tmp/dpa-warm-base bash "$root/scripts/ab_bench.sh" "$out/ab" "$patch_file" \
  "$rows" >/dev/null
echo "warm_ab_call: A/B done at $(elapsed) s"

for tool in racecheck synccheck memcheck; do
  left=$((deadline - $(elapsed)))
  if [ "$left" -lt 20 ]; then
    echo "warm_ab_call: no time left for $tool"
    continue
  fi
  timeout "$left" compute-sanitizer --tool "$tool" "$tests" --gtest_filter="$sanitize_filter" \
    >"$logs/$tool.log" 2>&1
  echo "$tool rc=$?: $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED" "$logs/$tool.log" |
    tr '\n' ' ')"
done
tar -czf "$out/logs.tar.gz" -C "$logs" .
cat "$out/ab/ab.md" 2>/dev/null
echo "warm_ab_call: $(elapsed) s"
