#!/usr/bin/env bash
# shellcheck disable=SC2317  # the step_* functions are called by name ("step_$step")
# The GPU check (issue 3): builds with ninja, runs the GPU test suite, compute-sanitizer
# memcheck and racecheck on a representative subset, and the benchmark against the PyTorch
# peers; writes every log to OUTDIR and ends with a short summary. A failing step does not stop
# the others; the exit status is non-zero when any step failed.
#
# usage: scripts/gpu_check.sh OUTDIR [STEP...]
#   steps: build test sanitize bench (default: all four, in that order); also `bench-bwd` (the
#   backward against the peers, into OUTDIR/bwd) and `host` (the host suite through ctest), not
#   run by default.
#
# OUTDIR receives at most 8 files (what the device tool returns): summary.txt; logs.tar.gz
# (build.log, gpu_tests.log, gpu_tests_shardN.xml (JUnit), gpu_tests_mma_sync.log,
# gpu_tests_mma_sync_backward.log, sanitizer.log, bench.log, bench_bwd.log);
# bench.md, bench.png, bench.json; bwd/bench.md, bwd/bench.png, bwd/bench.json.
#
# Environment:
#   DPA_BUILD_DIR        build directory (default: build-device in the repository)
#   DPA_CUDA_ARCHS       CMAKE_CUDA_ARCHITECTURES (default "80;90a")
#   DPA_JOBS             ninja jobs (default 16)
#   DPA_CHECK_BUDGET_S   wall-clock budget of the whole run in seconds (default 570); each step
#                        is stopped when it would overrun it, so the summary always prints
#   DPA_MEMCHECK_FILTER  gtest filter for memcheck (default: a representative subset)
#   DPA_RACECHECK_FILTER gtest filter for racecheck and synccheck (default: a smaller subset)
#   DPA_CHECK_FAMILIES   the kernel families whose cases `test` re-runs after the whole suite
#                        (default "mma_sync mma_sync_backward"; "" for none): a change to
#                        the backward alone needs only mma_sync_backward
#   DPA_CHECK_SHARDS     gtest shards `test` runs at once (default 4), each with its share of
#                        the cores for the cpu_exact references that take most of its time; 1
#                        runs the suite in one process
#   DPA_BENCH_ARGS       extra arguments for bench/compare.py (e.g. "--quick")
#
# .device/ (filled here by scripts/prepare_device.sh, carried to the GPU machine) holds peers.py
# and a GoogleTest source tree for machines without an installed GoogleTest.
set -o pipefail

if [ $# -lt 1 ]; then
  sed -n '3,/^set -o/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
shift
steps=("$@")
if [ ${#steps[@]} -eq 0 ]; then steps=(build test sanitize bench); fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPA_BUILD_DIR:-$root/build-device}"
archs="${DPA_CUDA_ARCHS:-80;90a}"
jobs="${DPA_JOBS:-16}"
budget="${DPA_CHECK_BUDGET_S:-570}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
started=$(date +%s)

memcheck_filter="${DPA_MEMCHECK_FILTER:-$(
  printf '%s:' \
    'FlashSelection.*' \
    'Cases/FlashForward.MatchesExact/hdim64_bf16' \
    'Cases/FlashForward.MatchesExact/hdim256_fp16' \
    'Cases/FlashForward.MatchesExact/mla192x128_causal_fp16' \
    'Cases/FlashForward.MatchesExact/thd_sink_causal_bottom_right' \
    'Cases/FlashForward.MatchesExact/padding_causal_bottom_right' \
    'Cases/FlashForward.MatchesExact/dropout_causal_sink_softcap' \
    'Cases/FlashForward.MatchesExact/dropout_hdim64_ring_wraps' \
    'Cases/FlashForward.MatchesExact/decode_thd_window' \
    'Cases/UnfusedForwardBackward.MatchesExact/thd_padded_offsets_causal' \
    'Cases/UnfusedForwardBackward.MatchesExact/arbitrary' \
    'Cases/UnfusedForwardBackward.MatchesExact/bias_pre_scale_softcap' \
    'Cases/UnfusedForwardBackward.MatchesExact/dropout_causal_sink_softcap' \
    'Cases/UnfusedForwardBackward.MatchesExact/decode_thd_window' \
    'Cases/FlashForwardBackward.MatchesExact/hdim256_fp16' \
    'Cases/FlashForwardBackward.MatchesExact/thd_padded_offsets_causal' \
    'Cases/FlashForwardBackward.MatchesExact/dropout_causal_sink_softcap' \
    'Cases/FlashForwardBackward.MatchesExact/window_bottom_right' \
    'Cases/FlashForwardBackward.MatchesExact/softcap_50' \
    'Cases/FlashForwardBackward.MatchesExact/sink_learnable_softcap_causal' \
    'Cases/FlashForwardBackward.MatchesExact/mla192x128_window_gqa_fp16' \
    'Cases/FlashForwardBackward.MatchesExact/dropout_mla192x128_gqa_window' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/long_decode_splits_bfloat16_d128' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/long_window_sink_softcap_bfloat16_d128' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/chunked_prefill_mixed_batch_float16_d64' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/decode_page1_bfloat16_d256' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/packed_queries_one_slot_cache_bfloat16_d128' \
    'GpuKvCacheTables.*' \
    'GpuDeviceComm.*' \
    'DeviceCommunicator/GpuCp.MatchesExact/causal_window_sink_all_gather_cp4' \
    'DeviceCommunicator/GpuCp.MatchesExact/thd_uneven_a2a_cp4' \
    'DeviceCommunicator/GpuCp.MatchesExact/post_bias_a2a_p2p_cp4_a2a2' \
    'DeviceCommunicator/GpuCpDropoutMask.KeepsExactlyThePhiloxElements/a2a_p2p_cp4_a2a2'
)}"
racecheck_filter="${DPA_RACECHECK_FILTER:-$(
  printf '%s:' \
    'Cases/FlashForward.MatchesExact/hdim128_bf16' \
    'Cases/FlashForward.MatchesExact/hdim256_fp16' \
    'Cases/FlashForward.MatchesExact/thd_sink_causal_bottom_right' \
    'Cases/FlashForward.MatchesExact/decode_thd_window' \
    'Cases/UnfusedForwardBackward.MatchesExact/thd_padded_offsets_causal' \
    'Cases/UnfusedForwardBackward.MatchesExact/sink_learnable_softcap_causal' \
    'Cases/FlashForwardBackward.MatchesExact/hdim128_bf16' \
    'Cases/FlashForwardBackward.MatchesExact/thd_sink_causal_bottom_right' \
    'Cases/FlashForwardBackward.MatchesExact/softcap_50' \
    'Cases/FlashForwardBackward.MatchesExact/sink_learnable_softcap_causal' \
    'Cases/FlashForwardBackward.MatchesExact/hdim192_sink_softcap_causal' \
    'Cases/FlashForwardBackward.MatchesExact/dropout_hdim192_sink_softcap_causal' \
    'Cases/FlashForward.MatchesExact/dropout_hdim64_ring_wraps' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/long_decode_splits_bfloat16_d128' \
    'Cases/GpuKvCache.MatchesExactWithTheCacheAppended/prefill_chunk_across_pages_float16_d64'
)}"
# No CP case under racecheck: with virtual ranks launching from several threads, racecheck
# reports "Internal Sanitizer Error: Detected a failure to track a kernel launch" and then
# does not finish causal_gqa_p2p_cp2 in 120 s (session 13). memcheck covers the CP cases above.

summary=()
failed=0

# Seconds left before the budget, minus a margin for the summary.
remaining() { echo $((budget - ($(date +%s) - started) - 15)); }

# record NAME STATUS SECONDS DETAIL
record() {
  summary+=("$(printf '%-10s %-12s %6ss  %s' "$1" "$2" "$3" "$4")")
  if [ "$2" != "ok" ] && [ "$2" != "skipped" ]; then failed=1; fi
}

# run_step LOG TIMEOUT CMD...: appends the command's output to LOG; returns its status (124 on
# timeout, 125 when no time was left to start it).
run_step() {
  local log="$1" limit="$2"
  shift 2
  if [ "$limit" -le 5 ]; then
    echo "not started: the budget of ${budget}s is spent" >>"$log"
    return 125
  fi
  echo "\$ $*" >>"$log"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >>"$log" 2>&1
}

# run_test_shards LOG TIMEOUT XML_STEM CMD...: runs the gtest binary CMD as DPA_CHECK_SHARDS
# shards at once (GTEST_TOTAL_SHARDS / GTEST_SHARD_INDEX), each with an equal share of the cores
# for its CPU references (DPA_NUM_THREADS) and, with a stem, its own JUnit file; appends the
# shards' logs to LOG in order and returns the worst status (a timeout outranks a failure).
run_test_shards() {
  local log="$1" limit="$2" xml="$3"
  shift 3
  local shards="${DPA_CHECK_SHARDS:-4}" cores threads i rc=0 status
  cores=$(nproc 2>/dev/null || echo 4)
  threads=$((cores / shards > 0 ? cores / shards : 1))
  local -a pids=() output=()
  for ((i = 0; i < shards; ++i)); do
    output=()
    [ -n "$xml" ] && output=("--gtest_output=xml:${xml}_shard$i.xml")
    : >"$log.$i"
    run_step "$log.$i" "$limit" env GTEST_TOTAL_SHARDS="$shards" GTEST_SHARD_INDEX="$i" \
      DPA_NUM_THREADS="$threads" "$@" "${output[@]}" &
    pids+=("$!")
  done
  for ((i = 0; i < shards; ++i)); do
    wait "${pids[$i]}"
    status=$?
    [ "$status" -gt "$rc" ] && rc=$status
    cat "$log.$i" >>"$log"
    rm -f "$log.$i"
  done
  return "$rc"
}

status_word() {
  case "$1" in
    0) echo ok ;;
    124 | 137) echo "TIMEOUT" ;;
    125) echo "NOT-RUN" ;;
    *) echo "FAILED($1)" ;;
  esac
}

gpu_info="$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
# The GPU machine gets a copy of the working tree whose .git may be older: prepare_device.sh
# records the commit it was run at.
commit="$(cat "$root/.device/commit" 2>/dev/null || git -C "$root" describe --always --dirty 2>/dev/null)"
echo "gpu_check: ${gpu_info:-no nvidia-smi}; commit ${commit:-unknown}; steps: ${steps[*]};" \
  "out: $out; budget ${budget}s"

step_build() {
  local log="$out/build.log" t0 rc cmake_args
  : >"$log"
  t0=$(date +%s)
  cmake_args=(-S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
    "-DCMAKE_CUDA_ARCHITECTURES=$archs")
  if [ -d "$root/.device/googletest" ]; then
    cmake_args+=("-DDPA_GTEST_SOURCE_DIR=$root/.device/googletest")
  fi
  run_step "$log" "$(remaining)" cmake "${cmake_args[@]}" &&
    run_step "$log" "$(remaining)" ninja -C "$build" -j "$jobs"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "---- build.log (last 40 lines) ----"
    tail -n 40 "$log"
  fi
  record build "$(status_word "$rc")" $(($(date +%s) - t0)) "build.log ($build)"
}

# "N passed, M failed, K skipped" from a gtest log, and the first failed names.
gtest_counts() {
  local log="$1" passed failed_n skipped
  passed=$(grep -c '^\[       OK \]' "$log")
  # Only each test's result line, which ends in its time: the summary at the end lists the
  # failed and skipped tests again (a parameterised one with "GetParam() = (...)").
  failed_n=$(grep -c '^\[  FAILED  \] .* ms)$' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] .* ms)$' "$log")
  echo "$passed passed, $failed_n failed, $skipped skipped"
}

step_test() {
  local log="$out/gpu_tests.log" t0 rc exe="$build/tests/dpa_gpu_tests"
  : >"$log"
  t0=$(date +%s)
  if [ ! -x "$exe" ]; then
    echo "no $exe (build first)" >>"$log"
    record test "NOT-RUN" 0 "no dpa_gpu_tests binary"
    return
  fi
  run_test_shards "$log" "$(remaining)" "$out/gpu_tests" "$exe"
  rc=$?
  local status
  status="$(status_word "$rc")"
  # On the GPU machine a skipped GPU test means the device was not found: that is a failure.
  if [ "$rc" -eq 0 ] && grep -q '^\[  SKIPPED \] .*(' "$log"; then status="SKIPPED-GPU"; fi
  record test "$status" $(($(date +%s) - t0)) "$(gtest_counts "$log"); gpu_tests.log"
  if [ "$rc" -ne 0 ]; then
    grep '^\[  FAILED  \] .*(' "$log" | head -n 20 | sed 's/^/    /'
  fi
  # On Hopper the library runs the warp-specialised wgmma kernel at every wgmma head dim; the
  # mma.sync family (what sm_80 runs) gets the same forward cases and the CP suite's GPU tiles,
  # through DPA_FLASH_FORWARD_KERNEL.
  # The backward cases run once more on the atomic-free mma.sync pair
  # (DPA_FLASH_BACKWARD_KERNEL=mma_sync; the default run above takes the one-kernel backward on
  # Hopper wherever it can).
  local kernel filter
  local -a families
  read -r -a families <<<"${DPA_CHECK_FAMILIES-mma_sync mma_sync_backward}"
  for kernel in "${families[@]}"; do
    log="$out/gpu_tests_$kernel.log"
    : >"$log"
    t0=$(date +%s)
    local -a environment=("DPA_FLASH_FORWARD_KERNEL=$kernel")
    filter='Cases/FlashForward.*:VirtualRanks/GpuCp.*'
    if [ "${kernel%_backward}" != "$kernel" ]; then
      environment=("DPA_FLASH_BACKWARD_KERNEL=${kernel%_backward}")
      filter='Cases/FlashForwardBackward.*:Backends/DropoutMask.*:FlashOnGpu.Deterministic*'
    fi
    run_test_shards "$log" "$(remaining)" "" env "${environment[@]}" "$exe" \
      --gtest_filter="$filter"
    rc=$?
    record "test-$kernel" "$(status_word "$rc")" $(($(date +%s) - t0)) \
      "$(gtest_counts "$log"); gpu_tests_$kernel.log"
    if [ "$rc" -ne 0 ]; then
      grep '^\[  FAILED  \] .*(' "$log" | head -n 20 | sed 's/^/    /'
    fi
  done
}

step_sanitize() {
  local log="$out/sanitizer.log" t0 rc exe="$build/tests/dpa_gpu_tests" limit detail
  : >"$log"
  local sanitizer
  sanitizer="$(command -v compute-sanitizer)"
  for candidate in "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")" \
    /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer; do
    if [ -z "$sanitizer" ] && [ -x "$candidate/compute-sanitizer" ]; then
      sanitizer="$candidate/compute-sanitizer"
    fi
  done
  if [ -z "$sanitizer" ]; then
    echo "compute-sanitizer not found" >>"$log"
    record memcheck "NOT-RUN" 0 "compute-sanitizer not found"
    return
  fi
  if [ ! -x "$exe" ]; then
    record memcheck "NOT-RUN" 0 "no dpa_gpu_tests binary"
    return
  fi
  # synccheck (barrier misuse) on racecheck's subset.
  for tool in memcheck racecheck synccheck; do
    t0=$(date +%s)
    local filter="$memcheck_filter"
    [ "$tool" != memcheck ] && filter="$racecheck_filter"
    echo "==== $tool ====" >>"$log"
    # Half of what is left for memcheck, then half of the rest for racecheck.
    limit=$(remaining)
    [ "$tool" != synccheck ] && limit=$((limit / 2))
    run_step "$log" "$limit" "$sanitizer" --tool "$tool" --error-exitcode 1 \
      --print-limit 20 "$exe" --gtest_filter="${filter%:}" --gtest_brief=1
    rc=$?
    # This tool's summary only (the log holds every tool's, one after the other).
    detail=$(sed -n "/^==== $tool ====/,\$p" "$log" | grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' |
      tail -n 1)
    record "$tool" "$(status_word "$rc")" $(($(date +%s) - t0)) "${detail:-see sanitizer.log}"
  done
}

step_bench() {
  local log="$out/bench.log" t0 rc limit
  : >"$log"
  t0=$(date +%s)
  if [ ! -x "$build/tools/dpa" ]; then
    record bench "NOT-RUN" 0 "no dpa binary"
    return
  fi
  limit=$(remaining)
  # shellcheck disable=SC2086
  run_step "$log" "$limit" python3 "$root/bench/compare.py" --out "$out" \
    --dpa "$build/tools/dpa" --peers "$root/.device/peers.py" --budget-s $((limit - 10)) \
    ${DPA_BENCH_ARGS:-}
  rc=$?
  record bench "$(status_word "$rc")" $(($(date +%s) - t0)) \
    "bench.md, bench.png, bench.json; bench.log"
}

# The backward against the peers' backward (compare.py --pass bwd), with the one-kernel backward
# opted in; into OUTDIR/bwd/.
step_bench_bwd() {
  local log="$out/bench_bwd.log" t0 rc limit
  : >"$log"
  t0=$(date +%s)
  if [ ! -x "$build/tools/dpa" ]; then
    record bench-bwd "NOT-RUN" 0 "no dpa binary"
    return
  fi
  limit=$(remaining)
  # shellcheck disable=SC2086
  run_step "$log" "$limit" python3 "$root/bench/compare.py" \
    --out "$out/bwd" --pass bwd --dpa "$build/tools/dpa" --peers "$root/.device/peers.py" \
    --budget-s $((limit - 10)) ${DPA_BENCH_ARGS:-}
  rc=$?
  record bench-bwd "$(status_word "$rc")" $(($(date +%s) - t0)) \
    "bwd/bench.md, bwd/bench.png, bwd/bench.json; bench_bwd.log"
}

step_host() {
  local log="$out/host_tests.log" t0 rc
  : >"$log"
  t0=$(date +%s)
  run_step "$log" "$(remaining)" ctest --test-dir "$build" -LE gpu -j "$jobs" --output-on-failure
  rc=$?
  record host "$(status_word "$rc")" $(($(date +%s) - t0)) "$(grep 'tests passed' "$log" | tail -n 1)"
}

# A later call on a fresh machine has no build: build first when a step needs one.
if [[ " ${steps[*]} " != *" build "* ]] &&
  { [ ! -x "$build/tests/dpa_gpu_tests" ] || [ ! -x "$build/tools/dpa" ]; }; then
  echo "gpu_check: no build in $build; adding the build step"
  steps=(build "${steps[@]}")
fi

for step in "${steps[@]}"; do
  case "$step" in
    build | test | sanitize | bench | host) "step_$step" ;;
    bench-bwd) step_bench_bwd ;;
    *)
      echo "gpu_check: unknown step '$step' (build, test, sanitize, bench, bench-bwd, host)" >&2
      record "$step" "UNKNOWN" 0 ""
      ;;
  esac
done

for table in "$out/bench.md" "$out/bwd/bench.md"; do
  if [ -f "$table" ]; then
    echo
    sed -n '/^| config/,/^$/p' "$table"
  fi
done
# The device tool returns at most 8 files: the logs travel as one archive.
(cd "$out" && shopt -s nullglob && logs=(*.log *.xml) && [ ${#logs[@]} -gt 0 ] &&
  tar czf logs.tar.gz "${logs[@]}" && rm -f "${logs[@]}")
{
  echo "== gpu_check summary: ${gpu_info:-unknown GPU}, commit ${commit:-unknown}," \
    "$(($(date +%s) - started))s, logs in $out (logs.tar.gz) =="
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.txt"
exit $failed
