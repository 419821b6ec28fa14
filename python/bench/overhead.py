"""Per-call cost of the Python paths against the C++ call (docs/perf.md), at the shape of
bench/call_overhead.cc: b=1, sq=1, H=G=8, d=128, causal (bottom-right), softcap 50.

    python python/bench/overhead.py --device cuda --keys 1024 [--cxx build/bench/call_overhead]

Each path runs `iters` back-to-back forward calls without grad; host_us_per_call is the wall
time of the loop before the final synchronisation (the enqueue cost), wall_us_per_call after
it. The C++ figure comes from the same loop in C++ (--cxx runs it and prints it alongside).
"""

import argparse
import json
import subprocess
import time

import torch

import dpa
import dpa.direct
from dpa import ops


def timed(fn, iters, device):
    for _ in range(50):
        fn()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    enqueued = time.perf_counter()
    if device == "cuda":
        torch.cuda.synchronize()
    done = time.perf_counter()
    return 1e6 * (enqueued - start) / iters, 1e6 * (done - start) / iters


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--keys", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--cxx", help="path of bench/call_overhead, run with the same shape")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    q = torch.randn(1, 1, 8, 128, device=args.device, dtype=dtype)
    k = torch.randn(1, args.keys, 8, 128, device=args.device, dtype=dtype)
    v = torch.randn_like(k)
    config = dpa.functional.resolve(
        qkv_format="bshd", causal=True, mask_type=None, window_size=(-1, -1),
        bottom_right_diagonal=None, softcap=50.0, softmax_scale=None, softmax_type=None,
        sinks=None, bias=None, bias_type=None, dropout_p=0.0, layer_number=None,
        deterministic=False, backend=None, padded=False)
    direct = dpa.direct.Attention(causal=True, softcap=50.0)
    out = torch.empty_like(q)
    lse = torch.empty(1, 8, 1, device=args.device)
    paths = {
        "dpa.attention": lambda: dpa.attention(q, k, v, causal=True, softcap=50.0),
        "torch.ops.dpa.forward": lambda: ops.forward(q, k, v, None, None, None, None, None, None,
                                                     None, None, None, *config),
        "dpa.direct": lambda: direct(q, k, v),
        "dpa.direct (out=, lse=)": lambda: direct(q, k, v, out=out, lse=lse),
    }
    # Where the time goes: the pieces of one direct call, each timed alone.
    from dpa._views import allocator_for, stream_of, view
    attention = ops._attention(config)
    views = [view(t, "t") for t in (q, k, v, out, lse)]
    parts = {
        "part: 5 view tuples": lambda: [view(t, "t") for t in (q, k, v, out, lse)],
        "part: current stream": lambda: stream_of(q),
        "part: o + lse allocation": lambda: (q.new_empty(q.shape), torch.empty(1, 8, 1, device=q.device)),
        "part: workspace tensor (torch.empty)": lambda: torch.empty(
            4096, dtype=torch.uint8, device=q.device),
        "part: extension call, no workspace callback": lambda: attention.forward(
            *views, None, None, None, None, None, None, None, None, 0.0, None, stream_of(q),
            None),
        "part: extension call, workspace callback": lambda: attention.forward(
            *views, None, None, None, None, None, None, None, None, 0.0, None, stream_of(q),
            allocator_for(q)),
        "peer: torch SDPA (same shape)": lambda: torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)),
    }
    paths.update(parts)
    rows = []
    if args.cxx:
        result = subprocess.run([args.cxx, "--device", args.device, "--keys", str(args.keys),
                                 "--iters", str(args.iters)], check=True, capture_output=True,
                                text=True)
        rows.append(json.loads(result.stdout))
    with torch.no_grad():
        for name, fn in paths.items():
            host, wall = timed(fn, args.iters, args.device)
            rows.append({"path": name, "device": args.device, "keys": args.keys,
                         "iters": args.iters, "host_us_per_call": round(host, 3),
                         "wall_us_per_call": round(wall, 3)})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
