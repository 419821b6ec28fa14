#!/usr/bin/env bash
# Builds and installs the dpa Python package (pip install ., DESIGN.md §11) into a virtual
# environment of its own and runs its pytest suite. Called by scripts/test.sh.
# Environment: DPA_VENV (default build-python/venv), DPA_PYTHON (default python3), DPA_JOBS.
# Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DPA_VENV:-$root/build-python/venv}"
if [ ! -x "$venv/bin/python" ]; then
  "${DPA_PYTHON:-python3}" -m venv "$venv"
fi
# The build requirements are installed once, so `pip install .` builds without isolation (a
# fresh isolated environment per build would fetch them again).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  "scikit-build-core>=0.10" "nanobind>=2.4" torch numpy pytest transformers megatron-core \
  onnx onnxruntime onnxscript
CMAKE_BUILD_PARALLEL_LEVEL="${DPA_JOBS:-$(nproc)}" \
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation "$root"
cd "$root"
"$venv/bin/python" -m pytest -q python/tests "$@"
