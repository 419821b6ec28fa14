"""Decode over a KV cache (issue 20): dpa.attention_with_kvcache against PyTorch's SDPA kernels
on the same cache, in one process, timed by one method.

    python bench/decode.py [--keys 32768] [--batches 1 16] [--json out.json]

Shape: sq = 1, H = 64 query heads over G = 8 KV heads, d = 128, bf16 (the issue's bar). Rows:
contiguous and paged caches (page sizes 16 and 64), and the issue's feature row: a learnable
sink, softcap 50 and a 128-token window over 16-token pages. GB/s counts the K and V bytes the
call must read (the keys a query sees) plus q and o. The peers read the same cache through a
[b, G, s, d] view: SDPA with enable_gqa under each of its backends (FlashAttention-2, cuDNN,
memory-efficient), the best one reported; they take no sink or softcap, so their figure is the
plain decode's. Where `flash_attn.cute` imports (FlashAttention-4, ../shared/bench/fa4/README.md),
FA4's `flash_attn_varlen_func` runs every row on the same cache as ours, paged ones through its
`page_table`, with the row's features (sink, softcap, window): the only peer with all of them
(on sm90 it has no split-KV). Its o is compared with ours, so that a peer computing something
else is seen. `copy` is a device-to-device copy of the same K and V bytes, timed alike: the
bandwidth the bar is measured against.

Timing: each callable runs `calls` times inside one CUDA graph (so host overhead is out of the
figure for every side alike); the graph is replayed `iters` times between CUDA events and the
median replay / calls is the time per call.
"""

import argparse
import json
import math

import torch
import torch.nn.functional as F

import dpa

try:
    from flash_attn.cute.interface import flash_attn_varlen_func as fa4_varlen
except Exception:  # not installed: the FA4 column stays empty
    fa4_varlen = None

HEADS, KV_HEADS, DIM = 64, 8, 128


def graph_ms(fn, calls=20, iters=30):
    """Median time per call of `fn` replayed in a CUDA graph of `calls` calls."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    times.sort()
    return times[len(times) // 2]


def make_cache(batch, keys, page_size, generator):
    """K and V [b, keys, G, d] contiguous, or paged [pages, page_size, G, d] with a shuffled
    block table; also [b, G, keys, d] views of the same keys for the peers (contiguous only)."""
    shape = (batch, keys, KV_HEADS, DIM)
    k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=generator)
    if page_size is None:
        return k, v, None
    pages = keys // page_size
    order = torch.randperm(batch * pages, device="cuda", generator=generator)
    k_pool = torch.empty((batch * pages, page_size, KV_HEADS, DIM), device="cuda",
                         dtype=torch.bfloat16)
    v_pool = torch.empty_like(k_pool)
    k_pool[order] = k.view(batch * pages, page_size, KV_HEADS, DIM)
    v_pool[order] = v.view(batch * pages, page_size, KV_HEADS, DIM)
    table = order.view(batch, pages).to(torch.int32)
    return k_pool, v_pool, table


def fa4_row(q, kc, vc, table, lens, features, reference):
    """FA4 on one row's cache and features: (ms, relative difference of its o from ours), or
    (None, None) where it is missing or refuses the row."""
    if fa4_varlen is None:
        return None, None
    extra = {}
    if "sinks" in features:
        extra["learnable_sink"] = features["sinks"]
    if "softcap" in features:
        extra["softcap"] = features["softcap"]
    if "window_size" in features:
        extra["window_size"] = features["window_size"]

    def fa4():
        out = fa4_varlen(q, kc, vc, seqused_k=lens, page_table=table, causal=True, **extra)
        return out[0] if isinstance(out, tuple) else out
    try:
        ms = graph_ms(fa4)
        o = fa4().float()
    except Exception as error:
        print(f"# fa4: {type(error).__name__}: {str(error)[:160]}")
        return None, None
    difference = ((o - reference).norm() / reference.norm()).item()
    return ms, difference


def gbps(batch, read_keys, ms):
    kv = 2 * batch * read_keys * KV_HEADS * DIM * 2
    qo = 2 * batch * HEADS * DIM * 2
    return (kv + qo) / (ms * 1e-3) / 1e9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=32768)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--json")
    args = parser.parse_args()
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    with torch.no_grad():
        for batch in args.batches:
            q = torch.randn((batch, 1, HEADS, DIM), device="cuda", dtype=torch.bfloat16,
                            generator=generator)
            lens = torch.full((batch,), args.keys, device="cuda", dtype=torch.int32)
            sinks = torch.randn(HEADS, device="cuda", generator=generator)
            k, v, _ = make_cache(batch, args.keys, None, generator)

            # Peers: the best SDPA backend over the contiguous cache.
            qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            peers = {}
            for name, backend in (("sdpa_flash", "FLASH_ATTENTION"),
                                  ("sdpa_cudnn", "CUDNN_ATTENTION"),
                                  ("sdpa_efficient", "EFFICIENT_ATTENTION")):
                kind = getattr(torch.nn.attention.SDPBackend, backend)

                def sdpa(kind=kind):
                    with torch.nn.attention.sdpa_kernel(kind):
                        return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
                try:
                    peers[name] = graph_ms(sdpa)
                except Exception as error:  # a backend that refuses the shape
                    peers[name] = None
                    print(f"# {name}: {type(error).__name__}: {str(error)[:120]}")
            best_peer = min((ms for ms in peers.values() if ms is not None), default=None)
            k_copy, v_copy = torch.empty_like(k), torch.empty_like(v)

            def copy():
                k_copy.copy_(k)
                v_copy.copy_(v)
            copy_ms = graph_ms(copy)
            copy_gbps = 2 * 2 * k.numel() * 2 / (copy_ms * 1e-3) / 1e9  # read + write
            print(f"b={batch:3d} copy of K and V: {copy_gbps:8.0f} GB/s (read + write)")

            for label, page_size, features in (("contiguous", None, {}),
                                               ("paged16", 16, {}),
                                               ("paged64", 64, {}),
                                               ("sink_softcap_window128", 16,
                                                dict(sinks=sinks, softcap=50.0,
                                                     window_size=(127, 0)))):
                if page_size is None:
                    kc, vc, table = k, v, None
                else:
                    kc, vc, table = make_cache(batch, args.keys, page_size, generator)

                def ours(kc=kc, vc=vc, table=table, features=features):
                    return dpa.attention_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                      block_table=table, causal=True,
                                                      **features)
                ms = graph_ms(ours)
                read = min(args.keys, 128) if "window_size" in features else args.keys
                row = dict(batch=batch, keys=args.keys, layout=label, dpa_ms=ms,
                           dpa_gbps=gbps(batch, read, ms), read_keys=read,
                           peer_ms=best_peer, peers=peers, copy_gbps=copy_gbps)
                if best_peer is not None:
                    row["peer_gbps"] = gbps(batch, args.keys, best_peer)
                    row["dpa_over_peer_gbps"] = row["dpa_gbps"] / row["peer_gbps"]
                fa4_ms, fa4_difference = fa4_row(q, kc, vc, table, lens, features,
                                                 ours().float())
                if fa4_ms is not None:
                    row.update(fa4_ms=fa4_ms, fa4_gbps=gbps(batch, read, fa4_ms),
                               fa4_relative_difference=fa4_difference)
                    row["dpa_over_fa4"] = fa4_ms / ms
                rows.append(row)
                peer = f"{row.get('peer_gbps', math.nan):8.0f}"
                fa4 = (f"   FA4 (same features) {row['fa4_gbps']:8.0f} GB/s, ratio "
                       f"{row['dpa_over_fa4']:5.2f}, o differs by {fa4_difference:.1e}"
                       if fa4_ms is not None else "")
                print(f"b={batch:3d} keys={args.keys} {label:24s} dpa {ms * 1e3:8.1f} us "
                      f"{row['dpa_gbps']:8.0f} GB/s   best SDPA {peer} GB/s   "
                      f"ratio {row.get('dpa_over_peer_gbps', math.nan):5.2f}{fa4}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
