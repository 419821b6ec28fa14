#!/usr/bin/env bash
# Helpers for the GPU machine's timing scripts (scripts/ab_bench.sh, scripts/variant_bench.sh);
# sourced, not run.

# The rows of a ROWS file, one `dpa bench` argument list per line: `#` starts a comment, blank
# lines and trailing blanks go.
bench_rows() {
  local line
  while IFS= read -r line; do
    line="${line%%#*}"
    line="${line%"${line##*[![:space:]]}"}"
    [ -z "${line// /}" ] && continue
    printf '%s\n' "$line"
  done <"$1"
}

# The median time in ms of one `dpa bench` run of BINARY ("... 6.563 ms  418.9 TFLOP/s"), or "-";
# the command and its output are appended to LOG.
bench_median_ms() {
  local log="$1" binary="$2"
  shift 2
  echo "\$ $binary bench --iters 20 $*" >>"$log"
  # shellcheck disable=SC2068
  timeout 60 "$binary" bench --iters 20 $@ </dev/null 2>&1 | tee -a "$log" |
    awk '$0 !~ /^#/ { for (i = 2; i <= NF; ++i) if ($i == "ms") { print $(i - 1); exit } }' |
    grep . || echo "-"
}
