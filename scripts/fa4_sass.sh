#!/usr/bin/env bash
# FlashAttention-4's Hopper backward as SASS, on a machine without a GPU: a virtual environment
# with torch, the CuTe DSL and FA4 (PyPI), bench/fa4_backward_compile.py for each head dim, then
# cuobjdump (scripts/sass_tools.sh) and scripts/sass_loops.py's steady-state loop of the kernel.
# For comparing instruction counts per tile with ours (docs/perf.md, session 37).
#
# usage: bash scripts/fa4_sass.sh OUTDIR [HEAD_DIM...]   (default 64 128)
#   FA4_SASS_VENV  the environment (default /tmp/fa4-sass-venv; made once)
# Writes OUTDIR/d<HEAD_DIM>/ (the PTX and cubin), OUTDIR/d<HEAD_DIM>.sass and .loop.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="$(mkdir -p "$1" && cd "$1" && pwd)"
shift
venv="${FA4_SASS_VENV:-/tmp/fa4-sass-venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check torch nvidia-cutlass-dsl==4.8.1 \
    apache-tvm-ffi==0.1.15.post2 einops
  # FA4's own dependencies pin a newer torch stack than the compile needs.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps flash-attn-4==4.0.0b36 \
    quack-kernels==0.6.5
fi
bin="$(bash "$root/scripts/sass_tools.sh")"
dims=("$@")
[ ${#dims[@]} -eq 0 ] && dims=(64 128)
for d in "${dims[@]}"; do
  rm -rf "$out/d$d" && mkdir -p "$out/d$d"
  CUTE_DSL_ARCH=sm_90a CUTE_DSL_KEEP=ptx,cubin CUTE_DSL_DUMP_DIR="$out/d$d" \
    CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" \
    "$venv/bin/python" "$root/bench/fa4_backward_compile.py" "$d" > "$out/d$d/compile.log" 2>&1
  cubin=$(ls "$out/d$d"/*.cubin)
  "$bin/cuobjdump" -sass "$cubin" > "$out/d$d.sass"
  "$bin/cuobjdump" -res-usage "$cubin" > "$out/d$d.res.txt"
  python3 "$root/scripts/sass_loops.py" "$out/d$d.sass" '' > "$out/d$d.loop.txt"
  echo "d$d:"; head -n 3 "$out/d$d.loop.txt"
done
