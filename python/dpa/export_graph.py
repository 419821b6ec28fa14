"""Attention in standard PyTorch operators, for ``torch.onnx.export``.

While a model is being exported to ONNX (``torch.onnx.is_in_onnx_export()``), dpa's calls take
this path instead of the custom op, so the ONNX graph is plain ONNX that any runtime executes:
MatMul, ``Tanh`` for the cap, the sink as one more term of each row's softmax sum (an extra
logit column, not materialised), the causal, window and padding masks built from index ranges,
GQA by repeating the KV heads, ALiBi, bias and arbitrary masks. The math is DESIGN.md §3, in
fp32, as the kernels compute it.

A feature the graph cannot express raises ``NotSupportedError`` naming it, so an export never
silently drops one: dropout in training mode (the graph cannot draw dpa's Philox mask) and
packed thd sequences.
"""

import torch

from . import errors

try:  # the ONNX exporter's own flag (see exporting())
    from torch.onnx._internal.exporter import _flags as _onnx_flags
except ImportError:
    _onnx_flags = None


def exporting() -> bool:
    """Whether torch.onnx.export is running. ``torch.onnx.is_in_onnx_export()`` says so, except
    while dynamo traces (the exporter's strict capture, which it falls back to when the
    non-strict one fails): dynamo folds that call to False, so the exporter's flag is read
    directly there. Without it the fallback would trace dpa's custom op, and the export would
    fail on an operator ONNX lacks instead of on the feature this module names."""
    return torch.onnx.is_in_onnx_export() or bool(
        getattr(_onnx_flags, "_is_onnx_exporting", False))


def _not_exportable(name, why):
    return errors.invalid(name, f"{why}; torch.onnx.export cannot express it, and dpa does not "
                          "export a graph without it", errors.NotSupportedError)


def _lengths(cu_seqlens, batch, full, device):
    """Per-sequence lengths [b] from cu_seqlens (the full axis when None)."""
    if cu_seqlens is None:
        return torch.full((batch,), full, dtype=torch.int64, device=device)
    cu = cu_seqlens.to(device=device, dtype=torch.int64)
    return cu[1:] - cu[:-1]


def attention_graph(q, k, v, config, *, cu_seqlens_q=None, cu_seqlens_kv=None,
                    cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, bias=None,
                    alibi_slopes=None, sinks=None, attn_mask=None):
    """o like q (with v's head dim) for a Resolved ``config`` (functional.resolve)."""
    if config.qkv_format == "thd":
        raise _not_exportable("qkv_format", "is 'thd' (packed sequences)")
    if config.dropout_p > 0:
        raise _not_exportable("dropout_p", f"is {config.dropout_p:g} in training mode (dpa's "
                              "dropout mask comes from its Philox stream)")
    if cu_seqlens_q_padded is not None or cu_seqlens_kv_padded is not None:
        raise _not_exportable("cu_seqlens_q_padded", "gives padded offsets")
    if config.bias_type not in ("no_bias", "pre_scale", "post_scale"):
        raise errors.invalid("bias_type", f"is {config.bias_type!r}, a name the export graph "
                             "does not know")
    if config.softmax_type not in ("vanilla", "off-by-one", "learnable"):
        raise errors.invalid("softmax_type", f"is {config.softmax_type!r}, a name the export "
                             "graph does not know")
    sbhd = config.qkv_format == "sbhd"
    # [b, H, s, d], in fp32 as the kernels accumulate.
    q4, k4, v4 = (t.permute(1, 2, 0, 3) if sbhd else t.permute(0, 2, 1, 3) for t in (q, k, v))
    q4, k4, v4 = q4.float(), k4.float(), v4.float()
    b, H, sq, d = q4.shape
    G, skv = k4.shape[1], k4.shape[2]
    if G != H:
        k4 = k4.repeat_interleave(H // G, dim=1)
        v4 = v4.repeat_interleave(H // G, dim=1)
    scale = config.softmax_scale if config.softmax_scale is not None else d ** -0.5
    logits = q4 @ k4.transpose(-1, -2)
    if bias is not None and config.bias_type == "pre_scale":
        logits = logits + bias.float()
    s = logits * scale
    if config.softcap > 0:
        s = config.softcap * torch.tanh(s / config.softcap)
    if bias is not None and config.bias_type == "post_scale":
        s = s + bias.float()

    # Visibility (DESIGN.md §3): inside both sequences, and i + delta - l <= j <= i + delta + r
    # with delta = len_kv - len_q when bottom-right aligned, else 0.
    device = q4.device
    len_q = _lengths(cu_seqlens_q, b, sq, device).view(b, 1, 1, 1)
    len_kv = _lengths(cu_seqlens_kv, b, skv, device).view(b, 1, 1, 1)
    i = torch.arange(sq, device=device).view(1, 1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, 1, skv)
    # The alignment as the library takes it (core/types.cc mask_bottom_right): TE's causal
    # masks are top-left, their *_bottom_right forms bottom-right, other masks follow
    # bottom_right_diagonal.
    if config.mask_type in ("causal", "padding_causal"):
        bottom_right = False
    elif config.mask_type in ("causal_bottom_right", "padding_causal_bottom_right"):
        bottom_right = True
    else:
        bottom_right = config.bottom_right_diagonal
    delta = (len_kv - len_q) if bottom_right else torch.zeros_like(len_q)
    visible = (i < len_q) & (j < len_kv)
    left, right = config.window_left, config.window_right
    if "causal" in config.mask_type:
        right = 0 if right < 0 else min(right, 0)
    if left >= 0:
        visible = visible & (j >= i + delta - left)
    if right >= 0:
        visible = visible & (j <= i + delta + right)
    if attn_mask is not None:
        visible = visible & ~attn_mask
    if alibi_slopes is not None:
        slopes = alibi_slopes.float()
        slopes = slopes.view(1, H, 1, 1) if slopes.dim() == 1 else slopes.view(b, H, 1, 1)
        s = s - slopes * (i + delta - j).abs().float()
    s = s.masked_fill(~visible, float("-inf"))

    # Softmax with the sink as one more logit; a row with nothing visible and no sink is 0.
    row_max = s.amax(dim=-1, keepdim=True)
    if config.softmax_type == "learnable":
        sink = sinks.float().view(1, H, 1, 1)
    elif config.softmax_type == "off-by-one":
        sink = torch.zeros(1, 1, 1, 1, device=device)
    else:
        sink = None
    if sink is not None:
        row_max = torch.maximum(row_max, sink)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    p = torch.exp(s - row_max)
    total = p.sum(dim=-1, keepdim=True)
    if sink is not None:
        total = total + torch.exp(sink - row_max)
    p = p / torch.where(total > 0, total, torch.ones_like(total))
    o = (p @ v4) * (i < len_q).float()  # rows past a sequence's end are 0, as dpa writes them
    o = o.permute(2, 0, 1, 3) if sbhd else o.permute(0, 2, 1, 3)
    return o.to(q.dtype)
