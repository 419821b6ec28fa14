#!/usr/bin/env bash
# The main job: build, then `dpa run` (Gemma-2-like and gpt-oss-like attention, forward and
# backward, on the best available backend; the CPU when there is no GPU).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/build.sh"
exec "${DPA_BUILD_DIR:-$root/build}/tools/dpa" run "$@"
