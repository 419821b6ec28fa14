"""Where an eager call's host time goes, on the GPU machine (docs/perf.md, session 54).

Session 54 read the gpt-oss window-128 backward 47 us slower eager than as a CUDA-graph replay
(0.915 against 0.868 ms), and the forward 26 us (0.248 against 0.222 ms). `dpa bench`
synchronises after each call, so the GPU waits at each call's start for the host work that comes
before its first kernel. This script runs the same calls through the Python package under
torch.profiler, which records each CUDA runtime and driver call the library makes and each GPU
operation. For every profiled call it prints:
- the host time from the call's start to its return;
- the time from the call's start to the first GPU operation's start (what the GPU waited);
- each GPU operation in order, with its duration and the idle gap before it;
- the CUDA API calls made during the call (count and host microseconds, by name).

    python3 bench/host_trace.py --out $OUT/trace [--window 128] [--calls 5]

It reads and keeps one Chrome trace per pass (trace_fwd.json, trace_bwd.json).
The Python layers add their own host time before the extension call. The API rows show what the
library's C++ part spends.
"""

import argparse
import collections
import json
import os

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import dpa

# gpt-oss's attention: d64, 64 query heads over 8 KV heads, causal, a learnable sink.
BATCH, HEADS_Q, HEADS_KV, SEQ, DIM = 2, 64, 8, 8192, 64


def make_inputs(requires_grad):
    g = torch.Generator(device="cuda").manual_seed(0)

    def normal(*shape, std=1.0):
        t = torch.randn(*shape, device="cuda", generator=g) * std
        return t.to(torch.bfloat16).requires_grad_(requires_grad)

    q = normal(BATCH, SEQ, HEADS_Q, DIM, std=1.5)
    k = normal(BATCH, SEQ, HEADS_KV, DIM, std=1.5)
    v = normal(BATCH, SEQ, HEADS_KV, DIM)
    sinks = torch.randn(HEADS_Q, device="cuda", generator=g).requires_grad_(requires_grad)
    return q, k, v, sinks


# Chrome-trace categories (torch.profiler's export): GPU operations, and the host's CUDA calls.
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATEGORIES = ("cuda_runtime", "cuda_driver")


def report_call(label, start, end, following, events):
    """One profiled call: the annotation's host range [start, end), and the trace's events up to
    the next call's start (`following`); the caller synchronises between calls, so the GPU
    operations in that span are this call's."""
    api = collections.defaultdict(lambda: [0, 0.0])
    gpu = []
    for e in events:
        ts, dur = float(e.get("ts", 0)), float(e.get("dur", 0))
        category = e.get("cat", "")
        if category in API_CATEGORIES and start <= ts and ts + dur <= end:
            api[e["name"]][0] += 1
            api[e["name"]][1] += dur
        elif category in GPU_CATEGORIES and start <= ts < following:
            gpu.append((ts, dur, e["name"]))
    gpu.sort()
    lines = [f"{label}: host {end - start:.1f} us from the call's start to its return, "
             f"{sum(us for _, us in api.values()):.1f} us of it in {sum(n for n, _ in api.values())} "
             f"CUDA calls"]
    if gpu:
        lines.append(f"  first GPU operation starts {gpu[0][0] - start:.1f} us after the call's "
                     f"start; the last ends {max(ts + dur for ts, dur, _ in gpu) - start:.1f} us "
                     f"after it")
    previous_end = start
    for ts, dur, name in gpu:
        lines.append(f"  gpu  gap {ts - previous_end:8.1f} us  runs {dur:9.1f} us  {name[:90]}")
        previous_end = max(previous_end, ts + dur)
    for name, (count, us) in sorted(api.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"  api  {count:3d} x  {us:8.1f} us  {name}")
    return "\n".join(lines)


def trace(label, call, calls, out):
    for _ in range(3):  # warm-up: the library's pool and the kernels' first loads
        call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            with record_function(f"{label} call {i}"):
                call()
            torch.cuda.synchronize()
    path = os.path.join(out, f"trace_{label}.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace_json = json.load(f)
    events = trace_json["traceEvents"] if isinstance(trace_json, dict) else trace_json
    markers = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
                     for e in events
                     if e.get("cat") == "user_annotation" and
                     str(e.get("name", "")).startswith(f"{label} call "))
    reports = []
    for i, (start, end) in enumerate(markers):
        following = markers[i + 1][0] if i + 1 < len(markers) else float("inf")
        reports.append(report_call(f"{label} call {i}", start, end, following, events))
    if not markers:
        reports.append(f"{label}: no annotated calls in {path}")
    return "\n".join(reports)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    window = (args.window - 1, 0)

    q, k, v, sinks = make_inputs(requires_grad=False)
    forward = dpa.direct.Attention(causal=True, window_size=window, learnable_sinks=True)
    out = torch.empty_like(q)
    lse = torch.empty(BATCH, HEADS_Q, SEQ, device="cuda")
    text = [trace("fwd", lambda: forward(q, k, v, sinks=sinks, out=out, lse=lse), args.calls,
                  args.out)]

    q, k, v, sinks = make_inputs(requires_grad=True)
    o = dpa.attention(q, k, v, causal=True, window_size=window, sinks=sinks)
    d_o = torch.randn_like(o)

    def backward():
        torch.autograd.grad(o, (q, k, v, sinks), d_o, retain_graph=True)

    text.append(trace("bwd", backward, args.calls, args.out))
    report = "\n\n".join(text)
    with open(os.path.join(args.out, "host_trace.txt"), "w") as f:
        f.write(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
