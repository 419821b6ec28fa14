"""PyTorch's CPU attention at bench/cpu_attention.cc's shape and timing, for docs/cpu_backend.md.

fp32, b=1, H=8, G=2 (enable_gqa), s=2048, d=64, causal; forward, and forward + backward, each
the best of --reps calls after one warm-up. Threads: --threads (torch.set_num_threads).

usage: python3 bench/torch_cpu_attention.py [--threads N] [--reps N]
"""
import argparse
import json
import time

import torch


def best_seconds(reps, call):
    call()  # warm-up
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    q = torch.rand(1, 8, 2048, 64) * 2 - 1
    k = torch.rand(1, 2, 2048, 64) * 2 - 1
    v = torch.rand(1, 2, 2048, 64) * 2 - 1
    d_o = torch.rand(1, 8, 2048, 64) * 2 - 1
    attention = torch.nn.functional.scaled_dot_product_attention

    def forward():
        with torch.no_grad():
            attention(q, k, v, is_causal=True, enable_gqa=True)

    def forward_backward():
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        attention(qg, kg, vg, is_causal=True, enable_gqa=True).backward(d_o)

    print(json.dumps({"torch": torch.__version__,
                      "forward_s": round(best_seconds(args.reps, forward), 4),
                      "forward_backward_s": round(best_seconds(args.reps, forward_backward), 4)}))


if __name__ == "__main__":
    main()
