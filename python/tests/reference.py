"""A pure-PyTorch reference of DESIGN.md §3-5, written from the spec and independent of dpa.

Everything runs in float64 on [b, H, s, d] tensors with plain autograd, so its gradients are the
reference gradients too. Dropout draws Philox4x32-10 in NumPy (uint64 arithmetic is exact for
32 x 32-bit products).
"""

import numpy as np
import torch

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)


def philox(counter, key):
    """counter: 4 uint64 arrays (32-bit values), key: 2 uint64 scalars -> 4 uint64 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & MASK32 for c in counter)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for _ in range(10):
        p0, p1 = M0 * c0, M1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & MASK32
        hi1, lo1 = p1 >> np.uint64(32), p1 & MASK32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return c0, c1, c2, c3


def dropout_keep(b, H, sq, skv, p, seed, offset, q_rows=None, kv_cols=None):
    """keep[b, H, sq, skv] and keep_prob per DESIGN.md §5. q_rows / kv_cols: the positions of
    the rows and columns in the full sequence (default 0..s-1)."""
    threshold = min(65535, round(p * 65536))
    keep_prob = 1.0 - threshold / 65536
    rows = np.arange(sq) if q_rows is None else np.asarray(q_rows)
    cols = np.arange(skv) if kv_cols is None else np.asarray(kv_cols)
    bb, hh, ii, jj = np.meshgrid(np.arange(b), np.arange(H), rows, cols, indexing="ij")
    counter = (jj >> 3, ii, hh + H * bb, np.full_like(jj, offset & 0xFFFFFFFF))
    words = philox(counter, (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    k = jj & 7
    word = np.choose(k // 2, words)
    u16 = np.where(k % 2 == 0, word & np.uint64(0xFFFF), word >> np.uint64(16))
    return torch.from_numpy(u16 >= threshold), keep_prob


def visible(sq, skv, window_left, window_right, bottom_right, len_q=None, len_kv=None):
    """bool [sq, skv]: key j visible to query i (§3), inside the sequences' own lengths."""
    len_q = sq if len_q is None else len_q
    len_kv = skv if len_kv is None else len_kv
    delta = len_kv - len_q if bottom_right else 0
    i = torch.arange(sq).view(-1, 1)
    j = torch.arange(skv).view(1, -1)
    ok = (i < len_q) & (j < len_kv)
    if window_left >= 0:
        ok &= j >= i + delta - window_left
    if window_right >= 0:
        ok &= j <= i + delta + window_right
    return ok


def attention(q, k, v, *, scale=None, softcap=0.0, window=(-1, -1), bottom_right=True,
              sink=None, bias=None, bias_type="post_scale", alibi=None, mask=None,
              lengths_q=None, lengths_kv=None, dropout=None):
    """q [b, H, sq, d], k / v [b, G, skv, d] (float64). sink: None, a float (off-by-one: 0.0),
    or a [H] tensor. mask: bool [b|1, H|1, sq, skv], True = masked. lengths_*: per-sequence
    lengths [b] (padding). dropout: (keep [b, H, sq, skv], keep_prob). Returns (o, lse) with
    padded query rows zeroed in o."""
    b, H, sq, d = q.shape
    G, skv = k.shape[1], k.shape[2]
    k = k.repeat_interleave(H // G, dim=1)
    v = v.repeat_interleave(H // G, dim=1)
    scale = d ** -0.5 if scale is None else scale
    logits = q @ k.transpose(-1, -2)
    if bias is not None and bias_type == "pre_scale":
        logits = logits + bias
    u = scale * logits
    s = softcap * torch.tanh(u / softcap) if softcap > 0 else u
    if bias is not None and bias_type == "post_scale":
        s = s + bias
    vis = torch.zeros(b, 1, sq, skv, dtype=torch.bool)
    for bi in range(b):
        lq = None if lengths_q is None else int(lengths_q[bi])
        lk = None if lengths_kv is None else int(lengths_kv[bi])
        vis[bi, 0] = visible(sq, skv, window[0], window[1], bottom_right, lq, lk)
        if alibi is not None:
            lq, lk = lq or sq, lk or skv
            delta = lk - lq if bottom_right else 0
            i = torch.arange(sq, dtype=torch.float64).view(-1, 1)
            j = torch.arange(skv, dtype=torch.float64).view(1, -1)
            slopes = alibi[bi] if alibi.dim() == 2 else alibi
            s[bi] = s[bi] - slopes.double().view(-1, 1, 1) * (i + delta - j).abs()
    if mask is not None:
        vis = vis & ~mask
    s = s.masked_fill(~vis, float("-inf"))
    if sink is not None:
        sig = (torch.full((H,), float(sink), dtype=torch.float64) if isinstance(sink, float)
               else sink.double())
        sig = sig.view(1, H, 1, 1).expand(b, H, sq, 1)
        full = torch.cat([s, sig], dim=-1)
    else:
        full = s
    m = full.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    z = torch.exp(full - m).sum(dim=-1, keepdim=True)
    lse = (m + torch.log(z)).squeeze(-1)
    # A row with no visible key and no sink has z = 0: p = 0 there (and no NaN in gradients).
    p = torch.exp(s - m) / torch.where(z > 0, z, torch.ones_like(z))
    if dropout is not None:
        keep, keep_prob = dropout
        p = p * keep.double() / keep_prob
    o = p @ v
    if lengths_q is not None:
        rows = torch.arange(sq).view(1, 1, -1, 1) < torch.as_tensor(lengths_q).view(-1, 1, 1, 1)
        o = o * rows
    return o, lse
