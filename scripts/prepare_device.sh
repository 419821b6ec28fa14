#!/usr/bin/env bash
# Fills the ignored .device/ folder with what scripts/gpu_check.sh needs on the GPU machine and
# cannot fetch there: the PyTorch peers script and a GoogleTest source tree (used only when the
# machine has no installed GoogleTest). Run it here, then carry '.device' with the GPU call.
#
# usage: scripts/prepare_device.sh
#   PEERS_PY         the peers script (default: ../shared/bench/peers.py beside the checkout,
#                    else /work/shared/bench/peers.py)
#   GTEST_SOURCE_DIR GoogleTest sources (default /usr/src/googletest)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
device="$root/.device"

peers="${PEERS_PY:-}"
if [ -z "$peers" ]; then
  for candidate in "$root/../shared/bench/peers.py" /work/shared/bench/peers.py; do
    if [ -f "$candidate" ]; then
      peers="$candidate"
      break
    fi
  done
fi
gtest="${GTEST_SOURCE_DIR:-/usr/src/googletest}"

if ! git -C "$root" check-ignore -q "$device/"; then
  echo "prepare_device: .device/ is not ignored by git; add '/.device/' to .gitignore" >&2
  exit 1
fi
mkdir -p "$device"
if [ -n "$peers" ] && [ -f "$peers" ]; then
  cp "$peers" "$device/peers.py"
  echo "prepare_device: $peers -> .device/peers.py"
else
  echo "prepare_device: no peers.py found (set PEERS_PY); the bench will run ours only" >&2
fi
if [ -f "$gtest/CMakeLists.txt" ]; then
  rm -rf "$device/googletest"
  cp -r "$gtest" "$device/googletest"
  echo "prepare_device: $gtest -> .device/googletest"
else
  echo "prepare_device: no GoogleTest sources at $gtest (set GTEST_SOURCE_DIR)" >&2
fi
# The GPU machine gets the working tree without .git: record which commit it is.
git -C "$root" describe --always --dirty >"$device/commit"
echo "prepare_device: commit $(cat "$device/commit") -> .device/commit"
du -sh "$device" | sed 's/^/prepare_device: size /'
echo "next: run scripts/gpu_check.sh OUTDIR on the GPU machine with carry ['.device']"
