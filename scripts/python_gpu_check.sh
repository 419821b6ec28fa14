#!/usr/bin/env bash
# The Python package on the GPU machine: pip install . (sm_90a only, for speed), the pytest
# suite (its CUDA tests run there), and the per-call overhead bench against the C++ call.
# usage: scripts/python_gpu_check.sh OUTDIR   (writes python_tests.log, overhead.jsonl there)
set -o pipefail
out="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
cd "$root" || exit 1
export PYTHONUNBUFFERED=1 CMAKE_BUILD_PARALLEL_LEVEL="${DPA_JOBS:-16}"
t0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -q \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a -C cmake.define.DPA_TOOLS=ON "$root" \
  >"$out/python_build.log" 2>&1 || { tail -n 40 "$out/python_build.log"; exit 1; }
echo "python build: $(($(date +%s) - t0)) s"
t0=$(date +%s)
python3 -m pytest -q -rs python/tests 2>&1 | tee "$out/python_tests.log" | tail -n 25
rc=${PIPESTATUS[0]}
echo "python tests: $(($(date +%s) - t0)) s, exit $rc"
cxx=$(find build-python -name call_overhead -type f -perm -u+x | head -n 1)
python3 python/bench/overhead.py --device cuda --keys 1024 --iters 5000 --cxx "$cxx" \
  | tee "$out/overhead.jsonl"
"$cxx" --device cuda --keys 1024 --iters 5000 --workspace | tee -a "$out/overhead.jsonl"
exit "$rc"
