# Sourced on the GPU machine: makes FlashAttention-4 importable in this shell, whichever call of
# a warm machine it is. ../shared/bench/fa4's install.sh installs into /tmp/site and exports
# PYTHONPATH into the shell that sources it only, and it deletes the staged part 1 as it joins
# the parts, so sourcing it again in a later call fails (session 52 lost FA4's rows that way).
# Here: if /tmp/site holds FA4 already, only PYTHONPATH is set; otherwise install.sh runs
# (after `bash .fa4a/stage.sh` in an earlier call, with .fa4b carried).
#
# usage: source scripts/fa4_env.sh   (returns non-zero if FA4 is neither installed nor staged)
if [ -d /tmp/site/flash_attn ]; then
  export PYTHONPATH=/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
  python3 -c "import flash_attn.cute.interface" && echo "fa4_env: FlashAttention-4 imports"
elif [ -f .fa4b/install.sh ]; then
  # shellcheck disable=SC1091
  source .fa4b/install.sh
else
  echo "fa4_env: FlashAttention-4 is neither in /tmp/site nor carried (.fa4b)" >&2
  false
fi
