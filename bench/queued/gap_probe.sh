#!/usr/bin/env bash
# One-off probe (session 54): host overhead and launch gaps of eager calls against graph replays.
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
if command -v nsys >/dev/null; then
  nsys profile -o $OUT/bwd128 --force-overwrite true -t cuda $D bench ${rows[0]} --iters 20 > /dev/null 2>&1
  nsys stats -r cuda_gpu_trace,cuda_api_sum -f csv -o $OUT/bwd128 $OUT/bwd128.nsys-rep > /dev/null 2>&1
  ls $OUT
  python3 - "$OUT/bwd128_cuda_gpu_trace.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rows = rows[-60:]
prev_end = None
for r in rows:
    s = int(r["Start (ns)"]); d = int(r["Duration (ns)"])
    gap = (s - prev_end) / 1e3 if prev_end else 0
    print(f"{gap:9.1f} us gap  {d/1e3:9.1f} us  {r['Name'][:90]}")
    prev_end = s + d
PY
else echo "no nsys"; fi
