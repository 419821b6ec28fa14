#!/usr/bin/env python3
"""dpa against its PyTorch peers, in one run on one GPU (issue 3's performance bar).

Runs `dpa bench` on the issue-3 and issue-17 configurations, then the peers: `peers.py` (SDPA
flash, SDPA cuDNN, FlexAttention with softcap and with a learnable sink, and FlashAttention-4
plain, with softcap and with a sink where `flash_attn.cute` imports; it measures b=2,
H=2048/d, s=8192, both causal and not) and, in this process, the shapes peers.py does not take
(GQA 64/8 with causal windows (127, 0) and (1023, 0) and a sink, gpt-oss-like, also on FA4; decode with 1
query against 32k keys), timed with peers.py's own median_ms. Prints one table of ratios
(ours / peer, the fa4 column being FA4 with the same feature, and ours / the best peer's
figure for the same shape without any feature: issue 17's bar) and writes
OUT/bench.md (the table and the commands), OUT/bench.png (TFLOP/s by config, ours against the
peers; GB/s for decode) and OUT/bench.json (everything).

FLOPs (DESIGN.md §10): forward 4*b*H*sq*skv*d, half for causal; windows count the visible
(query, key) pairs exactly, for us and for the peers alike, so every ratio is a time ratio.

--pass bwd (or fwdbwd) compares the backward (or forward+backward) instead, the peers from
peers.py's fwd/bwd times (it measures both; backward FLOPs are 2.5x the forward's,
forward+backward 3.5x) and the gpt-oss row against Flex's and FA4's backward, all timed as
peers.py does: forward+backward minus forward. Ours by the same method (issue 18: time both
sides alike): `dpa bench --pass fwdbwd` minus `--pass fwd`, with our backward timed alone
(`--pass bwd`) printed beside it. fwdbwd runs `dpa bench --pass fwdbwd`. The decode row is
forward only.

usage: python3 bench/compare.py --out DIR [--dpa build/tools/dpa] [--peers .device/peers.py]
                                [--pass fwd|bwd|fwdbwd]
"""
import argparse
import datetime
import importlib.util
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

S = 8192
# Our configurations. `peer_shape` is peers.py's (s, d) key (it uses b=2, H=2048/d); `flex` is
# the Flex variant that computes the same thing as ours; `extra` names an in-process peer set.
CONFIGS = [
    dict(name="d128", shape=(2, 16, 16, S, S, 128), flags=[], peer_shape=(S, 128), flex=None,
         fa4="fa4"),
    dict(name="d128 softcap50", shape=(2, 16, 16, S, S, 128), flags=["--softcap", "50"],
         peer_shape=(S, 128), flex="flex_softcap", fa4="fa4_softcap"),
    dict(name="d128 sink", shape=(2, 16, 16, S, S, 128), flags=["--softmax-type", "learnable"],
         peer_shape=(S, 128), flex="flex_sink", fa4="fa4_sink"),
    dict(name="d64", shape=(2, 32, 32, S, S, 64), flags=[], peer_shape=(S, 64), flex=None,
         fa4="fa4"),
    dict(name="d64 softcap50", shape=(2, 32, 32, S, S, 64), flags=["--softcap", "50"],
         peer_shape=(S, 64), flex="flex_softcap", fa4="fa4_softcap"),
    dict(name="d64 sink", shape=(2, 32, 32, S, S, 64), flags=["--softmax-type", "learnable"],
         peer_shape=(S, 64), flex="flex_sink", fa4="fa4_sink"),
    dict(name="d256", shape=(2, 8, 8, S, S, 256), flags=[], peer_shape=(S, 256), flex=None,
         fa4="fa4"),
    dict(name="d256 softcap50", shape=(2, 8, 8, S, S, 256), flags=["--softcap", "50"],
         peer_shape=(S, 256), flex="flex_softcap", fa4="fa4_softcap"),
    dict(name="d256 sink", shape=(2, 8, 8, S, S, 256), flags=["--softmax-type", "learnable"],
         peer_shape=(S, 256), flex="flex_sink", fa4="fa4_sink"),
]
# Each of the above runs non-causal and causal.
# gpt-oss shapes (issue 17): causal, window (w - 1, 0) for w = 128 and 1024, GQA 64/8, learnable
# sink.
GPT_OSS = [dict(name="gpt-oss d64 GQA64/8 win%d sink" % w, shape=(2, 64, 8, S, S, 64),
                flags=["--causal", "--window", "%d,0" % (w - 1), "--softmax-type", "learnable"],
                causal=True, window=w - 1, extra="window") for w in (128, 1024)]
DECODE = dict(name="decode GQA64/8 skv32k d128", shape=(2, 64, 8, 1, 32768, 128), flags=[],
              causal=False, extra="decode")
PEER_COLUMNS = ["sdpa_flash", "sdpa_cudnn", "flex", "fa4"]
# The bar: the best peer's figure for the same shape without any feature.
PLAIN_PEERS = ["sdpa_flash", "sdpa_cudnn", "fa4"]


def log(*args):
    print(*args, flush=True)


def shape_text(shape):
    return ",".join(str(x) for x in shape)


def window_pairs(s, left):
    """Visible pairs of one head: causal top-left with a left window (i - left <= j <= i)."""
    return sum(min(i, left) + 1 for i in range(s))


def forward_flops(cfg, causal):
    b, h, _, sq, skv, d = cfg["shape"]
    if cfg.get("window") is not None:
        return 4.0 * b * h * window_pairs(sq, cfg["window"]) * d
    return 4.0 * b * h * sq * skv * d / (2 if causal else 1)


def io_bytes(cfg):
    b, h, g, sq, skv, d = cfg["shape"]
    return 2.0 * (b * sq * h * d * 2 + b * skv * g * d * 2)  # bf16 q, o, k, v


def run_ours(args, cfg, causal, work, index):
    """Our row for the pass compared. The backward is timed as the peers' is (peers.py:
    forward+backward minus forward, each a median of CUDA-event timings), from `dpa bench
    --pass fwdbwd` and `--pass fwd`; our backward timed alone (`--pass bwd`) is kept beside it
    (tflops_alone, median_ms_alone)."""
    if args.bench_pass != "bwd":
        return run_ours_pass(args, cfg, causal, work, str(index), args.bench_pass)
    both = run_ours_pass(args, cfg, causal, work, "%d_fwdbwd" % index, "fwdbwd")
    forward = run_ours_pass(args, cfg, causal, work, "%d_fwd" % index, "fwd")
    alone = run_ours_pass(args, cfg, causal, work, "%d_bwd" % index, "bwd")
    row = dict(alone)
    row["command"] = "; ".join(r["command"] for r in (both, forward, alone))
    row["seconds"] = round(both["seconds"] + forward["seconds"] + alone["seconds"], 1)
    row["tflops_alone"], row["median_ms_alone"] = alone.get("tflops"), alone.get("median_ms")
    failed = [r for r in (both, forward) if "error" in r or r.get("median_ms") is None]
    if failed:
        row["error"] = failed[0].get("error", "no median_ms")
        return row
    ms = both["median_ms"] - forward["median_ms"]
    row.pop("error", None)
    row["median_ms"] = ms
    row["tflops"] = 2.5 * forward_flops(cfg, causal) / ms / 1e9 if ms > 0 else None
    return row


def run_ours_pass(args, cfg, causal, work, tag, bench_pass):
    out = os.path.join(work, "ours_%s.json" % tag)
    flags = list(cfg["flags"])
    if causal and "--causal" not in flags:
        flags.append("--causal")
    cmd = [args.dpa, "bench", "--shapes", shape_text(cfg["shape"]), "--iters", str(args.iters),
           "--warmup", str(args.warmup), "--label", cfg["name"], "--json", out] + flags
    if bench_pass != "fwd":
        cmd += ["--pass", bench_pass]
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    started = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    row = dict(name=cfg["name"], causal=causal, command=" ".join(shlex.quote(c) for c in cmd),
               seconds=round(time.time() - started, 1))
    try:
        result = json.load(open(out))[0]
        row.update(result)
    except Exception as e:  # the binary failed before writing JSON
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        row["error"] = "dpa bench exited %d: %s" % (proc.returncode, last[:200])
        row["exception"] = str(e)[:200]
    return row


def run_peers_script(args, work):
    """peers.py in a subprocess; JSON lines are parsed as they come, so a timeout keeps them."""
    out = os.path.join(work, "peers.json")
    cmd = [sys.executable, args.peers, "--shapes", args.peer_shapes, "--cap", "50",
           "--iters", str(max(20, args.iters)), "--json", out]
    log("$ " + " ".join(shlex.quote(c) for c in cmd))
    rows = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    deadline = time.time() + args.peers_timeout
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    timed_out = False
    while True:
        remaining = deadline - time.time()
        if remaining <= 0:
            timed_out = True
            proc.kill()
            break
        if not sel.select(timeout=min(remaining, 5.0)):
            if proc.poll() is not None:
                break
            continue
        line = proc.stdout.readline()
        if not line:
            break
        sys.stdout.write("  peers| " + line)
        sys.stdout.flush()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    proc.wait()
    status = dict(command=" ".join(shlex.quote(c) for c in cmd), returncode=proc.returncode,
                  timed_out=timed_out)
    if timed_out:
        log("peers.py stopped after %d s (--peers-timeout); %d rows kept" %
            (args.peers_timeout, len(rows)))
    return rows, status


def run_extra_peers(args, iters):
    """Peers for the shapes peers.py does not take, timed with peers.py's median_ms. For a
    backward pass only the gpt-oss row (decode has no backward), with the backward timed as
    peers.py times it."""
    backward = args.bench_pass != "fwd"
    rows = []
    try:
        spec = importlib.util.spec_from_file_location("dpa_peers", args.peers)
        peers = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(peers)
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel, SDPBackend
        from torch.nn.attention.flex_attention import create_block_mask
    except (Exception, SystemExit) as e:
        log("extra peers skipped: cannot load torch or peers.py: %s" % e)
        return [dict(peer="extra", error="cannot load torch/peers.py: %s" % str(e)[:160])]

    def measure(name, cfg, causal, fn, q, k, v):
        row = dict(peer=name, config=cfg["name"], causal=causal, shape=list(cfg["shape"]))
        try:
            with torch.no_grad():
                ms = peers.median_ms(lambda: fn(q, k, v), iters, 5)
            flops = forward_flops(cfg, causal)
            row.update(fwd_ms=ms, fwd_tflops=flops / ms / 1e9)
            if cfg["shape"][3] <= 16:
                row["fwd_gbps"] = io_bytes(cfg) / ms / 1e6
            if backward:
                for t in (q, k, v):
                    t.requires_grad_()
                d_o = torch.randn_like(q)

                def forward_backward():
                    q.grad = k.grad = v.grad = None
                    fn(q, k, v).backward(d_o)
                both = peers.median_ms(forward_backward, max(5, iters // 2), 3)
                row.update(bwd_ms=both - ms, bwd_tflops=2.5 * flops / (both - ms) / 1e9)
        except Exception as e:
            row["error"] = (str(e).splitlines() or [repr(e)])[0][:160]
        log("  extra| " + json.dumps(row))
        return row

    def tensors(cfg, seed=0):
        b, h, g, sq, skv, d = cfg["shape"]
        gen = torch.Generator(device="cuda").manual_seed(seed)
        mk = lambda heads, s: torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16,
                                          generator=gen)
        return mk(h, sq), mk(g, skv), mk(g, skv)

    def sdpa(backend, causal):
        def f(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        return f

    def gpt_oss_peers(cfg):
        found = []
        try:
            q, k, v = tensors(cfg)
            left = cfg["window"]
            s = cfg["shape"][3]
            bm = create_block_mask(lambda b, h, qi, ki: (qi >= ki) & (qi - ki <= left),
                                   None, None, s, s)
            sink = (torch.randn(cfg["shape"][1], device="cuda") * 2).requires_grad_(backward)

            def flex_window(q, k, v):
                return peers.flex(q, k, v, block_mask=bm, enable_gqa=True)

            def flex_window_sink(q, k, v):
                o, lse = peers.flex(q, k, v, block_mask=bm, enable_gqa=True, return_lse=True)
                w = torch.sigmoid(lse - sink.view(1, -1, 1))
                return (o.float() * w.unsqueeze(-1)).to(q.dtype)

            found.append(measure("flex_window", cfg, True, flex_window, q, k, v))
            found.append(measure("flex_window_sink", cfg, True, flex_window_sink, q, k, v))
            del q, k, v
            if getattr(peers, "fa4_func", None) is not None:
                # FA4 takes [b, s, h, d]; its window (left, 0) with causal is ours.
                q, k, v = (t.transpose(1, 2).contiguous() for t in tensors(cfg))

                def fa4_window_sink(q, k, v):
                    o = peers.fa4_func(q, k, v, causal=True, window_size=(left, 0),
                                       learnable_sink=sink)
                    return o[0] if isinstance(o, tuple) else o

                found.append(measure("fa4_window_sink", cfg, True, fa4_window_sink, q, k, v))
                del q, k, v
        except Exception as e:
            found.append(dict(peer="flex_window_sink", config=cfg["name"], error=str(e)[:160]))
        return found

    # gpt-oss-like: causal, window (w - 1, 0), GQA 64/8, learnable sink (Flex + renormalisation,
    # as peers.py's flex_sink does it; FA4 with its own window and sink).
    for cfg in GPT_OSS:
        rows += gpt_oss_peers(cfg)
    if backward:
        torch.cuda.empty_cache()
        return rows

    # Decode: one query row per (batch, head) against 32k keys.
    cfg = DECODE
    try:
        q, k, v = tensors(cfg)
        rows.append(measure("sdpa_flash", cfg, False, sdpa(SDPBackend.FLASH_ATTENTION, False),
                            q, k, v))
        rows.append(measure("sdpa_cudnn", cfg, False, sdpa(SDPBackend.CUDNN_ATTENTION, False),
                            q, k, v))
        rows.append(measure("flex", cfg, False,
                            lambda q, k, v: peers.flex(q, k, v, enable_gqa=True), q, k, v))
        del q, k, v
    except Exception as e:
        rows.append(dict(peer="decode", config=cfg["name"], error=str(e)[:160]))
    torch.cuda.empty_cache()  # leave the memory to peers.py
    return rows


def pass_tflops(row, bench_pass):
    """A peers.py row's TFLOP/s for the pass compared (backward 2.5x, both 3.5x the forward)."""
    if bench_pass == "fwd":
        return row["fwd_tflops"]
    if bench_pass == "bwd":
        return row["bwd_tflops"]
    forward_flops_e9 = row["fwd_tflops"] * row["fwd_ms"]
    return 3.5 * forward_flops_e9 / (row["fwd_ms"] + row["bwd_ms"])


def peer_value(peer_rows, extra_rows, cfg, causal, column, bench_pass="fwd"):
    """(peer name, value, unit) for one table cell, or None."""
    decode = cfg.get("extra") == "decode"
    if cfg.get("extra"):
        window = cfg.get("extra") == "window"
        names = {"sdpa_flash": ["sdpa_flash"], "sdpa_cudnn": ["sdpa_cudnn"],
                 "flex": ["flex_window_sink", "flex"] if window else ["flex"],
                 "fa4": ["fa4_window_sink"] if window else []}
        for name in names[column]:
            for r in extra_rows:
                if r.get("peer") == name and r.get("config") == cfg["name"]:
                    if "error" in r:
                        return (name, None, r["error"])
                    try:
                        return (name, r["fwd_gbps"] if decode else pass_tflops(r, bench_pass),
                                None)
                    except KeyError:
                        return (name, None, "no %s time" % bench_pass)
        return None
    s, d = cfg["peer_shape"]
    name = cfg.get(column) if column in ("flex", "fa4") else column
    if not name:
        return None
    for r in peer_rows:
        if r.get("peer") == name and r.get("s") == s and r.get("d") == d and \
                bool(r.get("causal")) == causal:
            if "error" in r:
                return (name, None, r["error"])
            try:
                return (name, pass_tflops(r, bench_pass), None)
            except KeyError:
                return (name, None, "no %s time" % bench_pass)
    return None


def build_table(ours, peer_rows, extra_rows, bench_pass="fwd"):
    table = []
    for row in ours:
        cfg = row["cfg"]
        decode = cfg.get("extra") == "decode"
        entry = dict(config=cfg["name"], causal=row["causal"], unit="GB/s" if decode else "TFLOP/s",
                     backend=row.get("backend"), ours=None, ours_error=row.get("error"))
        if "error" not in row:
            entry["ours"] = row.get("gbps") if decode else row.get("tflops")
            entry["median_ms"] = row.get("median_ms")
            if "tflops_alone" in row:
                entry["ours_alone"] = row["tflops_alone"]
        for column in PEER_COLUMNS:
            cell = peer_value(peer_rows, extra_rows, cfg, row["causal"], column, bench_pass)
            if cell is None:
                continue
            name, value, error = cell
            entry[column] = dict(peer=name, value=value, error=error,
                                 ratio=(entry["ours"] / value) if value and entry["ours"] else None)
        if not cfg.get("extra"):
            entry["best_plain"] = best_plain_peer(peer_rows, cfg, row["causal"], entry["ours"],
                                                  bench_pass)
        table.append(entry)
    return table


def best_plain_peer(peer_rows, cfg, causal, ours, bench_pass):
    """The fastest of PLAIN_PEERS for the config's shape without any feature, and our ratio."""
    best = None
    plain = dict(cfg, fa4="fa4")
    for column in PLAIN_PEERS:
        cell = peer_value(peer_rows, [], plain, causal, column, bench_pass)
        if cell and cell[1] and (best is None or cell[1] > best["value"]):
            best = dict(peer=cell[0], value=cell[1])
    if best:
        best["ratio"] = ours / best["value"] if ours else None
    return best


def fmt(x, digits=1):
    return "-" if x is None else ("%.*f" % (digits, x))


def table_markdown(table):
    head = "| config | causal | unit | ours (backend) |"
    rule = "|---|---|---|---|"
    for column in PEER_COLUMNS:
        head += " %s | ours/%s |" % (column, column)
        rule += "---|---|"
    head += " best plain peer | ours/best plain |"
    rule += "---|---|"
    lines = [head, rule]
    for e in table:
        ours = fmt(e["ours"], 0 if e["unit"] == "GB/s" else 1)
        if e["ours"] is None and e.get("ours_error"):
            ours = "error"
        backend = e.get("backend") or "-"
        if e.get("ours_alone") is not None:
            backend += "; backward alone %s" % fmt(e["ours_alone"])
        line = "| %s | %s | %s | %s (%s) |" % (e["config"], "yes" if e["causal"] else "no",
                                               e["unit"], ours, backend)
        for column in PEER_COLUMNS:
            cell = e.get(column)
            if not cell:
                line += " - | - |"
                continue
            label = cell["peer"] if column in ("flex", "fa4") else ""
            value = "error" if cell["value"] is None else fmt(cell["value"],
                                                              0 if e["unit"] == "GB/s" else 1)
            line += " %s%s | %s |" % (value, " (%s)" % label if label else "",
                                      "-" if cell["ratio"] is None else "%.2fx" % cell["ratio"])
        best = e.get("best_plain")
        if best:
            line += " %s (%s) | %s |" % (fmt(best["value"]), best["peer"],
                                         "-" if best["ratio"] is None else "%.2fx" % best["ratio"])
        else:
            line += " - | - |"
        lines.append(line)
    return "\n".join(lines)


def draw_chart(table, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:
        log("no chart: matplotlib missing (%s)" % e)
        return False
    compute = [e for e in table if e["unit"] == "TFLOP/s"]
    decode = [e for e in table if e["unit"] == "GB/s"]
    series = ["ours"] + PEER_COLUMNS
    colors = {"ours": "#d62728", "sdpa_flash": "#1f77b4", "sdpa_cudnn": "#2ca02c",
              "flex": "#ff7f0e", "fa4": "#9467bd"}
    fig, axes = plt.subplots(1, 2, figsize=(16, 6), gridspec_kw=dict(width_ratios=[6, 1]))

    def value(e, s):
        if s == "ours":
            return e["ours"] or 0
        cell = e.get(s)
        return (cell or {}).get("value") or 0

    for ax, rows, unit in ((axes[0], compute, "TFLOP/s"), (axes[1], decode, "GB/s")):
        width = 0.8 / len(series)
        for n, s in enumerate(series):
            xs = [i + (n - (len(series) - 1) / 2) * width for i in range(len(rows))]
            ax.bar(xs, [value(e, s) for e in rows], width, label=s, color=colors[s])
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(["%s%s" % (e["config"], "\ncausal" if e["causal"] else "")
                            for e in rows], rotation=45, ha="right", fontsize=8)
        ax.set_ylabel(unit)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_title("forward, bf16 (ours vs PyTorch peers; flex = the Flex variant that "
                      "computes the same features)")
    axes[1].set_title("decode")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def machine_info():
    info = dict(host=platform.node(), date=datetime.datetime.now().isoformat(timespec="seconds"))
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm",
             "--format=csv,noheader"], stdout=subprocess.PIPE, text=True, timeout=20).stdout.strip()
    except Exception:
        info["gpu"] = "unknown"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The GPU machine gets a copy of the tree whose .git may be older than the tree:
    # prepare_device.sh records the commit it was run at, which wins.
    try:
        info["commit"] = open(os.path.join(root, ".device", "commit")).read().strip() + \
            " (.device/commit)"
    except OSError:
        try:
            info["commit"] = subprocess.run(
                ["git", "-C", root, "describe", "--always", "--dirty"], stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL, text=True, timeout=10).stdout.strip() or "unknown"
        except Exception:
            info["commit"] = "unknown"
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for bench.md, bench.png, bench.json")
    ap.add_argument("--dpa", default="build/tools/dpa", help="the dpa binary")
    ap.add_argument("--peers", default=".device/peers.py", help="peers.py (PyTorch peers)")
    ap.add_argument("--peer-shapes", default="8192:128,8192:64,8192:256",
                    help="peers.py --shapes (s:d list; it runs causal and not for each)")
    ap.add_argument("--peers-timeout", type=float, default=420,
                    help="seconds after which peers.py is stopped (rows so far are kept)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="wall-clock budget of the whole run: peers.py gets what is left of it "
                         "(minus 30 s), the in-process peers are skipped under 120 s")
    ap.add_argument("--iters", type=int, default=30, help="timed runs per config (>= 20)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="d128 configs, the gpt-oss and decode rows, peers.py at 8192:128 only")
    ap.add_argument("--skip-peers", action="store_true", help="ours only")
    ap.add_argument("--pass", dest="bench_pass", choices=["fwd", "bwd", "fwdbwd"], default="fwd",
                    help="the pass compared (bwd, fwdbwd: the peers.py configurations and the gpt-oss row)")
    args = ap.parse_args()
    if args.iters < 20:
        ap.error("--iters must be >= 20 (DESIGN.md §10)")
    if args.quick:
        args.peer_shapes = "8192:128"
    os.makedirs(args.out, exist_ok=True)
    started = time.time()
    def left():
        if args.budget_s is None:
            return float("inf")
        return args.budget_s - (time.time() - started)

    info = machine_info()
    log("# compare: %s" % json.dumps(info))

    configs = [c for c in CONFIGS if not args.quick or c["shape"][5] == 128]
    ours = []
    with tempfile.TemporaryDirectory(prefix="dpa_compare_") as work:
        runs = [(cfg, causal) for cfg in configs for causal in (False, True)]
        runs += [(cfg, cfg["causal"]) for cfg in GPT_OSS]
        if args.bench_pass == "fwd":
            runs += [(DECODE, DECODE["causal"])]
        for index, (cfg, causal) in enumerate(runs):
            row = run_ours(args, cfg, causal, work, index)
            row["cfg"] = cfg
            ours.append(row)

        peer_rows, extra_rows, peers_status = [], [], dict(skipped=True)
        if not args.skip_peers:
            if not os.path.exists(args.peers):
                log("peers.py not found at %s (run scripts/prepare_device.sh)" % args.peers)
                peers_status = dict(error="peers.py not found at " + args.peers)
            else:
                if left() >= 120:
                    extra_rows = run_extra_peers(args, max(20, args.iters))
                else:
                    log("in-process peers skipped: %.0f s left of --budget-s" % left())
                args.peers_timeout = min(args.peers_timeout, left() - 30)
                if args.peers_timeout >= 30:
                    peer_rows, peers_status = run_peers_script(args, work)
                else:
                    log("peers.py skipped: %.0f s left of --budget-s" % left())
                    peers_status = dict(skipped="budget spent")

    table = build_table(ours, peer_rows, extra_rows, args.bench_pass)
    markdown = table_markdown(table)
    log("\n" + markdown)
    commands = [r["command"] for r in ours] + [peers_status.get("command", "")]
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write("## dpa vs PyTorch peers (%s, %s, commit %s)\n\n" %
                (info.get("gpu"), info["date"], info.get("commit")))
        what = dict(fwd="Forward only", bwd="Backward (2.5x the forward's FLOPs)",
                    fwdbwd="Forward + backward (3.5x the forward's FLOPs)")[args.bench_pass]
        f.write(what + ", bf16, median of >= 20 runs after warm-up, CUDA events. Ratios are "
                "ours / peer (> 1: ours is faster). SDPA peers have no softcap and no sink; "
                "`flex` and `fa4` are the FlexAttention and FlashAttention-4 variants with the "
                "same feature (softcap 50, learnable sink, causal window); `best plain peer` is "
                "the fastest of SDPA-flash, SDPA-cuDNN and FA4 on the same shape without any "
                "feature (issue 17's bar).\n\n")
        f.write(markdown + "\n\nReproduce: `python3 bench/compare.py --out OUT` (runs):\n\n")
        for c in commands:
            if c:
                f.write("    %s\n" % c)
    for row in ours:
        row.pop("cfg", None)
    json.dump(dict(machine=info, ours=ours, peers=peer_rows, extra_peers=extra_rows,
                   peers_status=peers_status, table=table), open(os.path.join(args.out,
                                                                              "bench.json"), "w"),
              indent=1)
    draw_chart(table, os.path.join(args.out, "bench.png"))
    failed = [r for r in ours if "error" in r]
    if failed:
        log("%d of our configurations failed" % len(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
