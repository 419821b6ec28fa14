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

# The median time in ms of one `dpa bench` run of BINARY ("... 6.5630 ms  418.9 TFLOP/s"), or "-";
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
# base runs), so that a drift of the GPU's clocks during the row (session 50 read the same base
# binary 5-20% apart within a row, mostly slower the second time; docs/perf.md) falls on both
# sides alike. Prints `| base | cand ms | base / cand | ...`: each time as the median of its
# runs (min-max, and "k/n runs" where some failed), each ratio as the median over the rounds of
# the mean of the two base runs around a candidate run over that run (> 1: the candidate is
# faster), with its min-max. A run that fails or prints no positive time counts as missing.
bench_rounds() {
  local log="$1" rounds="$2" args="$3" base="$4" times="" round binary i
  local -
  set -f  # ARGS is split into words on purpose, but never globbed
  shift 4
  for round in $(seq 0 "$rounds"); do
    # shellcheck disable=SC2086
    times+=" base=$(bench_median_ms "$log" "$base" $args)"
    [ "$round" -eq "$rounds" ] && break
    i=0
    for binary in "$@"; do
      # shellcheck disable=SC2086
      times+=" c$i=$(bench_median_ms "$log" "$binary" $args)"
      i=$((i + 1))
    done
  done
  awk -v candidates=$# -v rounds="$rounds" -v times="$times" '
    function ok(v) { return v != "-" && v != "" && v + 0 > 0 }
    function sort(a, n,   i, j, t) {
      for (i = 2; i <= n; ++i) for (j = i; j > 1 && a[j - 1] > a[j]; --j) {
        t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    }
    function median(a, n) { return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    function cell(a, n, expected, format,   text) {  # sorts a[1..n]
      if (n == 0) return "-"
      sort(a, n)
      text = sprintf(format " (" format "-" format ")", median(a, n), a[1], a[n])
      return n < expected ? text sprintf(", %d/%d runs", n, expected) : text
    }
    BEGIN {
      count = split(times, entries, " ")
      for (e = 1; e <= count; ++e) {
        split(entries[e], kv, "=")
        if (kv[1] == "base") { base_at[++seen] = kv[2]; continue }
        run_at[substr(kv[1], 2), seen] = kv[2]
      }
      nb = 0
      for (r = 1; r <= seen; ++r) if (ok(base_at[r])) b[++nb] = base_at[r] + 0
      line = "| " cell(b, nb, rounds + 1, "%.4f") " |"
      for (k = 0; k < candidates; ++k) {
        nc = 0; nr = 0
        delete c; delete ratio
        for (r = 1; r < seen; ++r) {
          v = run_at[k, r]
          if (!ok(v)) continue
          c[++nc] = v + 0
          if (ok(base_at[r]) && ok(base_at[r + 1]))
            ratio[++nr] = (base_at[r] + base_at[r + 1]) / 2 / v
        }
        line = line " " cell(c, nc, rounds, "%.4f") " |"
        text = nr ? cell(ratio, nr, nr, "%.3f") : "-"
        sub(/ \(/, "x (", text)
        line = line " " text " |"
      }
      print line
    }'
}
