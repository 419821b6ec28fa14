#!/usr/bin/env bash
# Probe (session 54): eager calls against graph replays of one captured call; the difference is
# host work the GPU waits for (the breakdown: bench/host_trace.py).
set -u
OUT=$1; D=build-device/tools/dpa; mkdir -p $OUT
rows=("--pass bwd --shapes 2,64,8,8192,8192,64 --causal --window 127,0 --softmax-type learnable"
      "--pass bwd --shapes 2,64,8,8192,8192,64 --causal --window 1023,0 --softmax-type learnable"
      "--pass fwd --shapes 2,64,8,8192,8192,64 --causal --window 127,0 --softmax-type learnable"
      "--pass bwd --shapes 2,32,32,8192,8192,64"
      "--pass fwd --shapes 2,32,32,8192,8192,64 --softcap 50")
for r in "${rows[@]}"; do
  for g in "" "--graph"; do
    for rep in 1 2; do $D bench $g $r --iters 40 | tail -1 | sed "s/^/[$g] /"; done
  done
done | tee $OUT/graph_vs_eager.txt
