#!/usr/bin/env bash
# Profiles one kernel launch of each `dpa bench` row with Nsight Compute on the GPU machine and
# keeps text only (reports are too large to bring back): per row the throughput, warp-state,
# scheduler and compute-workload sections, the pipes' busy shares and the shared-memory bank
# conflicts, and the source view's summary (scripts/ncu_source_summary.py: the hottest SASS
# lines, the instruction mix per warp-tile, the stall reasons, the conflicting lines). For finding
# where a kernel's time goes before changing it (docs/perf.md's rule: predict, then measure).
#
# usage: scripts/ncu_rows.sh OUTDIR ROWS KERNEL_REGEX
#   ROWS          one `dpa bench` argument list per line (`#` starts a comment), as for
#                 scripts/ab_bench.sh; a line `! COMMAND` profiles COMMAND instead (a peer's
#                 kernel, e.g. `! python3 bench/peer_backward.py --head-dim 128`)
#   KERNEL_REGEX  ncu's --kernel-name regex (e.g. `sm90_ws`, `kvcache_attention`, `one_kernel`)
#
# Environment: DPA_BUILD_DIR (default build-device; built by scripts/gpu_check.sh OUTDIR build
# when missing), NCU (default ncu), NCU_HOT_LINES (default 40: source lines kept per row).
# Writes OUTDIR/ncu.txt (every row's sections and hot lines), its gzip copy, and OUTDIR/ncu.log.
set -uo pipefail

if [ $# -ne 3 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
rows_file="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
kernel="$3"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DPA_BUILD_DIR:-$root/build-device}"
ncu="${NCU:-ncu}"
hot_lines="${NCU_HOT_LINES:-40}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
report="$out/ncu.txt"
log="$out/ncu.log"
: >"$report"
: >"$log"

if [ ! -x "$build/tools/dpa" ]; then
  DPA_BUILD_DIR="$build" bash "$root/scripts/gpu_check.sh" "$out/check" build >>"$log" 2>&1
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT

row_number=0
while IFS= read -r line; do
  args="${line%%#*}"
  [ -z "${args// /}" ] && continue
  row_number=$((row_number + 1))
  rep="$scratch/row$row_number"
  if [ "${args:0:1}" = "!" ]; then
    command=(bash -c "${args:1}")
  else
    # shellcheck disable=SC2206
    command=("$build/tools/dpa" bench --iters 20 --warmup 3 $args)
  fi
  {
    echo "=================================================================="
    echo "row $row_number: ${command[*]} (kernel regex $kernel)"
  } >>"$report"
  # One launch after the warm-up ones, the clocks as the bench leaves them.
  if ! timeout 300 "$ncu" --clock-control none --target-processes all \
    --kernel-name "regex:$kernel" --launch-skip 3 --launch-count 1 --set full \
    --import-source yes -f -o "$rep" "${command[@]}" </dev/null >>"$log" 2>&1; then
    echo "ncu failed (see ncu.log)" >>"$report"
    continue
  fi
  "$ncu" --import "$rep.ncu-rep" --page details \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section SchedulerStats --section InstructionStats --section MemoryWorkloadAnalysis \
    --section ComputeWorkloadAnalysis >>"$report" 2>>"$log"
  # Which pipe binds (session 21 read the MUFU share off the instruction counts instead): the
  # pipes' busy shares, the issue slots, and the shared-memory bank conflicts (not yet run: if
  # ncu refuses a metric name, the report says so and ncu.log has its message).
  echo "--- pipes (% of peak, active cycles), issue, shared-memory bank conflicts ---" >>"$report"
  "$ncu" --import "$rep.ncu-rep" --page raw --csv --metrics \
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,\
sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum \
    >>"$report" 2>>"$log" || echo "(the raw metrics failed: see ncu.log)" >>"$report"
  # The source view as CSV: the hottest lines, the instruction mix per warp-tile, the stall
  # reasons and the bank conflicts by line (scripts/ncu_source_summary.py).
  if "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass \
    >"$scratch/source.csv" 2>>"$log"; then
    python3 "$root/scripts/ncu_source_summary.py" "$scratch/source.csv" "$hot_lines" \
      >>"$report" 2>>"$log" || echo "(the source summary failed: see ncu.log)" >>"$report"
  fi
done <"$rows_file"
# The device tool once left ncu.txt out of the returned files; a compressed copy travels too.
gzip -kf "$report"
echo "ncu_rows: $row_number rows profiled into $report (and $report.gz)"
