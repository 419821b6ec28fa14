#!/usr/bin/env bash
# Kernel durations of `dpa bench` rows under Nsight Compute, for one or more builds, on the GPU
# machine: for calls whose launch cost hides the kernel in `dpa bench`'s timing (an eager decode
# call at b = 1 costs ~100 us of host work against a ~45 us kernel), so an A/B of the kernel
# itself reads its durations here. Each row runs every build in turn; each profiles LAUNCHES
# launches of the kernels matching KERNEL_REGEX after the warm-up ones (clocks as the bench
# leaves them) and reports each kernel's median duration.
#
# usage: scripts/ncu_durations.sh OUTDIR ROWS KERNEL_REGEX DPA [DPA...]
#   ROWS          one `dpa bench` argument list per line (`#` starts a comment)
#   KERNEL_REGEX  ncu's --kernel-name regex (e.g. `kvcache` for the attention and its merge)
#   DPA           the `dpa` binaries to compare (e.g. build-device/tools/dpa and the base build's
#                 from scripts/ab_bench.sh, /tmp/dpa-ab-base/build/tools/dpa)
#
# Environment: NCU (default ncu), LAUNCHES (default 6).
# Writes OUTDIR/durations.md (one table: row, kernel, each build's median us) and OUTDIR/ncu.log.
set -uo pipefail

if [ $# -lt 4 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
rows_file="$2"
kernel="$3"
shift 3
builds=("$@")
ncu="${NCU:-ncu}"
launches="${LAUNCHES:-6}"
mkdir -p "$out"
log="$out/ncu.log"
: >"$log"
table="$out/durations.md"
{
  printf '| dpa bench arguments | kernel |'
  for b in "${builds[@]}"; do printf ' %s (us) |' "$b"; done
  printf '\n|---|---|'
  for _ in "${builds[@]}"; do printf -- '---|'; done
  printf '\n'
} >"$table"

# Median duration (us) per kernel name from ncu's CSV (Kernel Name, Metric Name, Metric Value).
medians() {
  python3 -c '
import csv, statistics, sys
by_kernel = {}
for row in csv.DictReader(sys.stdin):
    if row.get("Metric Name") != "Duration":
        continue
    value = float(row["Metric Value"].replace(",", ""))
    if row.get("Metric Unit") == "ms":
        value *= 1000.0
    elif row.get("Metric Unit") == "ns":
        value /= 1000.0
    name = row["Kernel Name"].split("(")[0].split("<")[0].replace("void ", "")
    by_kernel.setdefault(name, []).append(value)
for name, values in sorted(by_kernel.items()):
    print(f"{name} {statistics.median(values):.2f}")
'
}

while IFS= read -r line; do
  args="${line%%#*}"
  [ -z "${args// /}" ] && continue
  declare -A cell=()
  kernels=()
  for i in "${!builds[@]}"; do
    # shellcheck disable=SC2086
    csv="$("$ncu" --clock-control none --kernel-name "regex:$kernel" --launch-skip 6 \
      --launch-count "$launches" --section SpeedOfLight --csv \
      "${builds[$i]}" bench --iters 20 --warmup 3 $args 2>>"$log" | grep '^"')"
    while read -r name us; do
      [ -z "$name" ] && continue
      cell["$name,$i"]="$us"
      [[ " ${kernels[*]} " == *" $name "* ]] || kernels+=("$name")
    done < <(printf '%s\n' "$csv" | medians)
  done
  for name in "${kernels[@]}"; do
    # shellcheck disable=SC2016  # the backquotes are Markdown, not a command
    printf '| `%s` | %s |' "$args" "$name" >>"$table"
    for i in "${!builds[@]}"; do printf ' %s |' "${cell[$name,$i]:--}" >>"$table"; done
    printf '\n' >>"$table"
  done
  unset cell
done <"$rows_file"
cat "$table"
