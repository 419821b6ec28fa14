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

# Times one row in interleaved rounds and prints its table cells:
#   bench_rounds LOG ROUNDS "ARGS" BASE CANDIDATE...
# runs BASE, every CANDIDATE, BASE, every CANDIDATE, ..., BASE (ROUNDS candidate runs, ROUNDS + 1
# base runs), so that a drift of the GPU's clocks during the row (it warms up over a call and
# read its base 5-20% apart on the same binary, docs/perf.md, session 50) falls on both sides
# alike. Prints `| base | cand ms | base / cand | ...` with each time as the median of its runs
# (min-max) and each ratio as base median / candidate median (> 1: the candidate is faster),
# with its range over the rounds, where round r compares the mean of the base runs around it.
bench_rounds() {
  local log="$1" rounds="$2" args="$3" base="$4"
  shift 4
  local times="" round binary
  for round in $(seq 0 "$rounds"); do
    # shellcheck disable=SC2086
    times+=" base=$(bench_median_ms "$log" "$base" $args)"
    [ "$round" -eq "$rounds" ] && break
    local i=0
    for binary in "$@"; do
      # shellcheck disable=SC2086
      times+=" c$i=$(bench_median_ms "$log" "$binary" $args)"
      i=$((i + 1))
    done
  done
  awk -v candidates=$# -v times="$times" '
    function median(a, n,   i, j, t) {  # sorts a[1..n] in place
      for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] > a[j]; --j) {
        t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function cell(a, n,   c, i) {
      if (n == 0) return "-"
      for (i = 1; i <= n; ++i) c[i] = a[i]
      median(c, n)
      return sprintf("%.3f (%.3f-%.3f)", median(a, n), c[1], c[n])
    }
    BEGIN {
      count = split(times, entries, " ")
      nb = 0
      for (e = 1; e <= count; ++e) {
        split(entries[e], kv, "=")
        if (kv[1] == "base") { base_at[++rounds_seen] = kv[2]; continue }
        k = substr(kv[1], 2)
        run_at[k, rounds_seen] = kv[2]
      }
      for (r = 1; r <= rounds_seen; ++r) if (base_at[r] != "-") b[++nb] = base_at[r]
      line = "| " cell(b, nb) " |"
      base_median = nb ? median(b, nb) : 0
      for (k = 0; k < candidates; ++k) {
        nc = 0; lo = ""; hi = ""
        delete c
        for (r = 1; r < rounds_seen; ++r) {
          v = run_at[k, r]
          if (v == "-" || v == "") continue
          c[++nc] = v
          if (base_at[r] == "-" || base_at[r + 1] == "-") continue
          ratio = (base_at[r] + base_at[r + 1]) / 2 / v
          if (lo == "" || ratio < lo) lo = ratio
          if (hi == "" || ratio > hi) hi = ratio
        }
        line = line " " cell(c, nc) " |"
        if (nc == 0 || nb == 0) { line = line " - |"; continue }
        line = line sprintf(" %.3fx", base_median / median(c, nc))
        line = line (lo == "" ? " |" : sprintf(" (%.3f-%.3f) |", lo, hi))
      }
      print line
    }'
}
