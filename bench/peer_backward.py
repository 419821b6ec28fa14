"""One peer's attention backward, run a few times at one shape, for a profiler to catch
(`scripts/ncu_rows.sh` rows of the form `! python3 bench/peer_backward.py ...`): the kernels a
peer launches for the backward the tables of docs/perf.md compare ours with, so that their
instruction mix and stalls can be read beside ours.

    python bench/peer_backward.py --peer fa4 --head-dim 128 [--causal] [--repeats 5]

Peers: `fa4` (FlashAttention-4's `flash_attn_func`, ../shared/bench/fa4/README.md says how to
install it on the GPU machine) and `sdpa_cudnn` (PyTorch SDPA's cuDNN backend). Shape as
peers.py's: bf16, b = 16384 / s, H = 2048 / d. One forward, then `repeats` backwards of the same
graph; each backward launches the peer's whole backward (its pre- and post-passes included).
"""

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


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
    args = ap.parse_args()
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
    for _ in range(args.repeats):
        torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    torch.cuda.synchronize()
    print(f"{args.peer} backward x{args.repeats}: b={b} h={h} s={s} d={d} causal={args.causal}")


if __name__ == "__main__":
    main()
