#!/usr/bin/env bash
# One device call for a kernel change that is in this tree: the GPU suite on the tree, the A/B of
# each PATCH against the tree without it over its ROWS (scripts/ab_bench.sh, every base built in
# the background while the suite runs), then compute-sanitizer memcheck, racecheck and synccheck
# over FILTER with the time left. Prints the summaries and the A/B tables at the end.
#
# usage: scripts/ab_call.sh OUTDIR [PATCH:ROWS ...]
#   PATCH  a change against its base (`git diff BASE -- src include > .device/NAME.patch` here,
#          then carry .device); ROWS a rows file (scripts/ab_bench.sh)
#
# Environment: AB_DEADLINE_S (default 560: seconds from the start after which the sanitizers get
# no time), AB_SANITIZE_FILTER (default: the one-kernel backward's cases, both forms, dropout,
# partial tiles, deterministic mode), DPA_CUDA_ARCHS (default 90a). Each A/B writes OUTDIR/abN/;
# the suite OUTDIR/check/, the sanitizers OUTDIR/san/ (8 files returned at most: keep to three
# A/Bs). Candidates that are not in the tree are timed with scripts/variant_bench.sh instead.
set -uo pipefail

if [ $# -lt 1 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
shift
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deadline="${AB_DEADLINE_S:-560}"
export DPA_CUDA_ARCHS="${DPA_CUDA_ARCHS:-90a}" DPA_CHECK_FAMILIES=""
filter="${AB_SANITIZE_FILTER:-$(
  printf 'Cases/FlashForwardBackward.MatchesExact/%s:' hdim64_bf16 hdim128_bf16 hdim256_bf16 \
    thd_padded_offsets_causal sq1025_causal dropout_0p1 dropout_hdim64_narrow_window_sink \
    dropout_causal_sink_softcap dropout_mla192x128_deterministic_off_by_one_fp16 \
    softcap_thd_window_sink
  printf 'FlashOnGpu.Deterministic*'
)}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }

pairs=("$@")
for n in "${!pairs[@]}"; do
  AB_BASE_ROOT="/tmp/dpa-ab-base-$n" AB_START_BASE=1 bash "$root/scripts/ab_bench.sh" \
    "$out/ab$n" "${pairs[$n]%%:*}" "${pairs[$n]#*:}"
done
DPA_CHECK_BUDGET_S=$((deadline / 2)) bash "$root/scripts/gpu_check.sh" "$out/check" build test
echo "ab_call: suite done at $(elapsed) s"
for n in "${!pairs[@]}"; do
  AB_BASE_ROOT="/tmp/dpa-ab-base-$n" bash "$root/scripts/ab_bench.sh" "$out/ab$n" \
    "${pairs[$n]%%:*}" "${pairs[$n]#*:}" >/dev/null
  echo "ab_call: A/B $n done at $(elapsed) s"
done
left=$((deadline - $(elapsed)))
if [ "$left" -gt 30 ]; then
  DPA_MEMCHECK_FILTER="$filter" DPA_RACECHECK_FILTER="$filter" DPA_CHECK_BUDGET_S=$left \
    bash "$root/scripts/gpu_check.sh" "$out/san" sanitize >/dev/null
else
  echo "ab_call: no time left for the sanitizers ($left s)"
fi
cat "$out/check/summary.txt" "$out/san/summary.txt" 2>/dev/null
for n in "${!pairs[@]}"; do cat "$out/ab$n/ab.md" 2>/dev/null; done
echo "ab_call: $(elapsed) s"
