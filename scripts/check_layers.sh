#!/usr/bin/env bash
# The include direction of DESIGN.md §1: each layer of src/ may include only the layers below
# it and the public headers (dpa/). Fails naming every wrong-way include. Run by
# scripts/test.sh (so in CI).
#   core: core, dpa (not the facade dpa/attention.h)   cpu, cuda: core, their own, dpa
#   cp:   core, cp, cuda, dpa (the device ring and staging)   api: anything
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
status=0
check() {  # check LAYER ALLOWED...
  local layer="$1"
  shift
  local allowed="$*"
  while IFS= read -r line; do
    local file="${line%%:*}" target
    target="$(sed -E 's/.*#include "([a-z_]+)\/.*/\1/' <<<"$line")"
    if [[ " $allowed " != *" $target "* ]]; then
      echo "check_layers: ${file#"$root"/} includes $target/ (src/$layer may include: $allowed)"
      status=1
    fi
  done < <(grep -rHE '#include "[a-z_]+/' "$root/src/$layer" || true)
}
check core core dpa
# Core takes the argument and selection types from their own headers, never the facade.
if grep -rlE '#include "dpa/attention.h"' "$root/src/core" >/dev/null; then
  grep -rlE '#include "dpa/attention.h"' "$root/src/core" |
    sed "s|^$root/|check_layers: |; s|\$| includes the facade dpa/attention.h (use dpa/arguments.h, dpa/selection.h)|"
  status=1
fi
check cpu core cpu dpa
check cuda core cuda dpa
check cp core cp cuda dpa
exit "$status"
