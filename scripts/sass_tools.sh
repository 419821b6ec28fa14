#!/usr/bin/env bash
# Fetches cuobjdump and nvdisasm (PyPI's nvidia-cuda-cuobjdump / -nvdisasm wheels; the CUDA
# image here compiles but does not ship them) into a cache folder and prints the folder that
# holds the binaries. For reading SASS without a GPU (scripts/sass_loops.py).
#
# usage: bin=$(bash scripts/sass_tools.sh) && "$bin/cuobjdump" -sass -arch sm_90a OBJECT.o
#   SASS_TOOLS_DIR  the cache (default /tmp/sass-tools)
set -euo pipefail
dir="${SASS_TOOLS_DIR:-/tmp/sass-tools}"
bin="$dir/x/nvidia/cu13/bin"
if [ ! -x "$bin/cuobjdump" ]; then
  mkdir -p "$dir"
  python3 -m pip download -q --no-deps -d "$dir" nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >&2
  for wheel in "$dir"/*.whl; do
    python3 -m zipfile -e "$wheel" "$dir/x"
  done
  chmod +x "$bin"/* 2>/dev/null || true
fi
if [ ! -x "$bin/cuobjdump" ]; then
  echo "sass_tools: no cuobjdump under $bin (did the wheels' layout change?)" >&2
  exit 1
fi
echo "$bin"
