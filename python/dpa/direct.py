"""The direct path: forward only, past the dispatcher and autograd, for serving loops.

    attention = dpa.direct.Attention(causal=True, softcap=50.0)
    o = attention(q, k, v, sinks=sinks)          # or attention(q, k, v, out=o, lse=lse)

It resolves the config once, at construction, and each call makes only the extension call
(plus the output allocation unless ``out`` / ``lse`` are given). No autograd graph, no
torch.compile tracing: use dpa.attention for those. docs/perf.md has its per-call cost.
"""

import torch

from . import errors, ops
from ._views import allocator_for, stream_of, view
from .functional import resolve


class Attention:
    def __init__(self, *, qkv_format="bshd", causal=False, mask_type=None, window_size=(-1, -1),
                 bottom_right_diagonal=None, softcap=0.0, softmax_scale=None,
                 softmax_type=None, learnable_sinks=False, bias_type=None, layer_number=None,
                 backend=None):
        if qkv_format not in ("bshd", "sbhd", "thd"):
            raise errors.invalid("qkv_format", f"must be bshd, sbhd or thd, got {qkv_format!r}")
        # Placeholders: resolve reads only whether sinks and a bias will be given.
        sinks = torch.empty(0) if learnable_sinks else None
        bias = torch.empty(0) if bias_type not in (None, "no_bias") else None
        self.config = resolve(
            qkv_format=qkv_format, causal=causal, mask_type=mask_type, window_size=window_size,
            bottom_right_diagonal=bottom_right_diagonal, softcap=softcap,
            softmax_scale=softmax_scale, softmax_type=softmax_type, sinks=sinks, bias=bias,
            bias_type=bias_type, dropout_p=0.0,
            layer_number=layer_number, deterministic=False, backend=backend,
            padded=qkv_format == "thd")
        self._attention = ops._attention(self.config)

    def __call__(self, q, k, v, *, sinks=None, alibi_slopes=None, bias=None, attn_mask=None,
                 cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
                 cu_seqlens_kv_padded=None, out=None, lse=None, return_lse=False):
        if out is None:
            out = q.new_empty(q.shape[:-1] + (v.shape[-1],))
        if lse is None:
            lse = torch.empty(ops.lse_shape(q, self.config.qkv_format), dtype=torch.float32,
                              device=q.device)
        self._attention.forward(
            view(q, "q"), view(k, "k"), view(v, "v"), view(out, "o"), view(lse, "lse"),
            view(cu_seqlens_q, "cu_seqlens_q"), view(cu_seqlens_kv, "cu_seqlens_kv"),
            view(cu_seqlens_q_padded, "cu_seqlens_q_padded"),
            view(cu_seqlens_kv_padded, "cu_seqlens_kv_padded"), view(bias, "bias"),
            view(alibi_slopes, "alibi_slopes"), view(sinks, "sinks"),
            view(attn_mask, "attn_mask"), 0.0, None, stream_of(q), allocator_for(q))
        return (out, lse) if return_lse else out
