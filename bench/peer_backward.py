"""One peer's attention backward, run a few times at one shape, for a profiler to catch
(`scripts/ncu_rows.sh` rows of the form `! python3 bench/peer_backward.py ...`): the kernels a
peer launches for the backward the tables of docs/perf.md compare ours with, so that their
instruction mix and stalls can be read beside ours.

    python bench/peer_backward.py --peer fa4 --head-dim 128 [--causal] [--repeats 5]
        [--fa4-tile-m 64] [--time]

Peers: `fa4` (FlashAttention-4's `flash_attn_func`, ../shared/bench/fa4/README.md says how to
install it on the GPU machine) and `sdpa_cudnn` (PyTorch SDPA's cuDNN backend). Shape as
peers.py's: bf16, b = 16384 / s, H = 2048 / d. One forward, then `repeats` backwards of the same
graph; each backward launches the peer's whole backward (its pre- and post-passes included).

`--fa4-tile-m` overrides the query tile FA4 picks for its sm90 backward (80 at d128 without a
mask, 64 with one), so FA4 can be timed against itself at 64 and 80 rows: the question of
docs/cuda_flash.md's "Untried differences" item 1. `--time` prints the median of the backwards'
CUDA-event times.
"""

import argparse
import dataclasses
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def force_fa4_tile_m(tile_m):
    """Makes FA4's sm90 backward run query tiles of tile_m rows (its own rule for the dq GEMM's
    operand order: swapped where the tile is not a multiple of 64)."""
    from flash_attn.cute import interface

    chosen = interface._tile_size_bwd_sm90

    def forced(*args, **kwargs):
        config = chosen(*args, **kwargs)
        return dataclasses.replace(config, m_block_size=tile_m, dQ_swapAB=tile_m % 64 != 0)

    interface._tile_size_bwd_sm90 = forced


def attention(peer, causal):
    if peer == "fa4":
        from flash_attn.cute.interface import flash_attn_func

        def fa4(q, k, v):  # FA4 takes [b, s, h, d]
            o = flash_attn_func(q, k, v, causal=causal)
            return o[0] if isinstance(o, tuple) else o

        return fa4, "bshd"

    def cudnn(q, k, v):
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return cudnn, "bhsd"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--peer", choices=["fa4", "sdpa_cudnn"], default="fa4")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--fa4-tile-m", type=int, help="FA4's backward query tile (rows)")
    ap.add_argument("--time", action="store_true", help="print the median backward time")
    args = ap.parse_args()
    if args.fa4_tile_m is not None:
        if args.peer != "fa4":
            ap.error("--fa4-tile-m applies to --peer fa4 only")
        force_fa4_tile_m(args.fa4_tile_m)
    s, d = args.seqlen, args.head_dim
    b, h = max(1, 16384 // s), max(1, 2048 // d)
    fn, layout = attention(args.peer, args.causal)
    shape = (b, s, h, d) if layout == "bshd" else (b, h, s, d)
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (
        torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
        for _ in range(3)
    )
    o = fn(q, k, v)
    do = torch.randn_like(o)
    times_ms = []
    for _ in range(args.repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        end.record()
        end.synchronize()
        times_ms.append(start.elapsed_time(end))
    print(f"{args.peer} backward x{args.repeats}: b={b} h={h} s={s} d={d} causal={args.causal}"
          f" tile_m={args.fa4_tile_m or 'default'}")
    if args.time:
        # The first backward compiles FA4's kernel; the median skips it when there are three
        # or more.
        median = statistics.median(times_ms[1:] if len(times_ms) > 2 else times_ms)
        flops = 2.5 * 4 * b * h * s * s * d / (2 if args.causal else 1)
        print(f"median {median:.3f} ms, {flops / median / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
