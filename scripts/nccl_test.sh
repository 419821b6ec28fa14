#!/usr/bin/env bash
# The NCCL communicator's multi-process tests: NPROC processes, one per GPU (default 2).
#   scripts/nccl_test.sh [NPROC] [extra dpa_nccl_tests arguments, e.g. --no-dead-peer]
# Builds first when ${DPA_BUILD_DIR:-build} has no dpa_nccl_tests. The binary forks and execs
# one worker per rank with RANK / WORLD_SIZE / LOCAL_RANK and a fresh DPA_NCCL_ID_FILE (no
# mpirun needed), and prints "skipped" (exit 0) with fewer GPUs than ranks. docs/nccl.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DPA_BUILD_DIR:-$root/build}"
nproc=2
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then  # NPROC is optional: --no-dead-peer alone works
  nproc="$1"
  shift
fi
binary="$build_dir/tests/dpa_nccl_tests"
if [ ! -x "$binary" ]; then
  "$root/scripts/build.sh"
fi
if [ ! -x "$binary" ]; then
  echo "nccl_test.sh: $binary was not built (DPA_NCCL is off: no CUDA or no NCCL found)" >&2
  exit 1
fi
exec "$binary" --nproc "$nproc" "$@"
