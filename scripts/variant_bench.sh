#!/usr/bin/env bash
# Times variants of this tree in one call on the GPU machine (docs/perf.md's rule: ours against
# ours only in the same call, by the same method). The base is this tree as built in the build
# directory scripts/gpu_check.sh uses; each variant is the tree with one PATCH applied, rebuilt
# incrementally in the same directory (only the files a patch touches recompile), its `dpa` kept
# aside, the patch then reversed. Every row of ROWS is timed with `dpa bench` in interleaved
# rounds (scripts/bench_common.sh, bench_rounds: base, each variant, base, ..., base); the table
# gives each build's median (min-max) and base / variant (> 1: the variant is faster) with its
# range over the rounds. Meant for knock-out experiments (a patch removes one part of
# a kernel's work to show what that part costs) and for several candidate changes at once.
# The tree is left as it was, also when the script is stopped (a timeout's TERM); its build
# directory then holds the last variant's objects until the next build.
#
# usage: scripts/variant_bench.sh OUTDIR ROWS PATCH...
#   ROWS   one `dpa bench` argument list per line (`#` starts a comment), as for ab_bench.sh
#   PATCH  a change against this tree (here: `git diff > .device/NAME.patch`, carry .device);
#          the variant is named after the file. `-R:PATCH` is the tree with PATCH, a change the
#          tree holds, reversed (variant `no_NAME`): a queued change timed against its absence
#          while the tree, and so the suite, keeps it.
#
# Environment: DPA_BUILD_DIR (default build-device), DPA_CUDA_ARCHS (default 90a), DPA_JOBS
# (default 16), DPA_VARIANT_BINARIES (a directory that keeps each build's dpa), DPA_BENCH_ROUNDS
# (default 3: rounds per row; each costs one `dpa bench` run per build). Writes
# OUTDIR/variants.md (the table and the commands) and OUTDIR/variants.log.
set -uo pipefail

if [ $# -lt 3 ]; then
  sed -n '2,/^set -uo/p' "$0" | sed 's/^# \{0,1\}//' | sed '$d' >&2
  exit 2
fi
out="$1"
rows_file="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/bench_common.sh
source "$root/scripts/bench_common.sh"
build="${DPA_BUILD_DIR:-$root/build-device}"
archs="${DPA_CUDA_ARCHS:-90a}"
jobs="${DPA_JOBS:-16}"
rounds="${DPA_BENCH_ROUNDS:-3}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
log="$out/variants.log"
: >"$log"
# Each build's `dpa`, named base and after its patch: kept in DPA_VARIANT_BINARIES when that is
# set (for scripts/ncu_durations.sh afterwards), else in a directory removed on exit.
binaries="${DPA_VARIANT_BINARIES:-}"
keep_binaries="$binaries"
[ -n "$binaries" ] || binaries="$(mktemp -d)"
mkdir -p "$binaries"
applied=""  # the patch now applied to the tree, undone on any exit (a timeout included)
undo=""     # patch's flags that undo it: -R, or none for a reversed patch
cleanup() {
  [ -n "$applied" ] && (cd "$root" && patch -s $undo -p1 <"$applied") >>"$log" 2>&1
  [ -n "$keep_binaries" ] || rm -rf "$binaries"
}
trap cleanup EXIT
trap 'exit 124' TERM INT

if [ ! -x "$build/tools/dpa" ]; then
  DPA_CUDA_ARCHS="$archs" DPA_JOBS="$jobs" bash "$root/scripts/gpu_check.sh" "$out/check" build
fi
ninja -C "$build" -j "$jobs" dpa_cli >>"$log" 2>&1 || {
  echo "variant_bench: the base does not build (see $log)" >&2
  exit 1
}
cp "$build/tools/dpa" "$binaries/base"
names=()
for patch_file in "$@"; do
  do_flags="" undo_flags="-R" name_prefix=""
  if [[ "$patch_file" == -R:* ]]; then
    patch_file="${patch_file#-R:}" do_flags="-R" undo_flags="" name_prefix="no_"
  fi
  name="$name_prefix$(basename "$patch_file" .patch)"
  patch_file="$(cd "$(dirname "$patch_file")" && pwd)/$(basename "$patch_file")"
  start=$(date +%s)
  if ! (cd "$root" && patch -s $do_flags -p1 <"$patch_file") >>"$log" 2>&1; then
    echo "variant $name: the patch does not apply (skipped)" | tee -a "$log" >&2
    continue
  fi
  applied="$patch_file" undo="$undo_flags"
  if ninja -C "$build" -j "$jobs" dpa_cli >>"$log" 2>&1; then
    cp "$build/tools/dpa" "$binaries/$name"
    names+=("$name")
    echo "variant $name built in $(($(date +%s) - start)) s" >>"$log"
  else
    echo "variant $name: does not build (skipped; see $log)" | tee -a "$log" >&2
  fi
  (cd "$root" && patch -s $undo_flags -p1 <"$patch_file") >>"$log" 2>&1
  applied=""
done

{
  echo "# Variants: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null |
    head -1); base = $(tr '\n' ' ' <"$root/.device/commit" 2>/dev/null)"
  echo
  header="| dpa bench arguments | base ms |"
  rule="|---|---|"
  for name in "${names[@]}"; do
    header+=" $name ms | base / $name |"
    rule+="---|---|"
  done
  echo "$header"
  echo "$rule"
  variant_binaries=()
  for name in "${names[@]}"; do variant_binaries+=("$binaries/$name"); done
  while IFS= read -r line; do
    echo "| \`$line\` $(bench_rounds "$log" "$rounds" "$line" "$binaries/base" \
      "${variant_binaries[@]}")"
  done < <(bench_rows "$rows_file")
} | tee "$out/variants.md"
