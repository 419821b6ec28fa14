"""dpa.torch.TransformerLayer: TransformerEngine's TransformerLayer on dpa's attention.

A block of self-attention, for ``layer_type="decoder"`` cross-attention over
``encoder_output``, and an MLP, each with a residual connection and a norm (LayerNorm or
RMSNorm): before the sublayer by default (pre-norm), after the residual sum with
``output_layernorm=True`` (post-norm). The soft-cap, the softmax type (sinks) and the windows
reach both attentions, from the constructor and from the forward's overrides.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from .. import errors
from .multihead_attention import MultiheadAttention, make_norm

# TE's activation names; the gated ones split fc1's output into (gate, value) halves.
_ACTIVATIONS = {
    "gelu": (lambda x: F.gelu(x, approximate="tanh"), False),
    "relu": (F.relu, False),
    "silu": (F.silu, False),
    "geglu": (lambda x: F.gelu(x, approximate="tanh"), True),
    "swiglu": (F.silu, True),
}


class TransformerLayer(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        ffn_hidden_size: int,
        num_attention_heads: int,
        num_gqa_groups: Optional[int] = None,
        layernorm_epsilon: float = 1e-5,
        hidden_dropout: float = 0.1,
        attention_dropout: float = 0.1,
        layer_number: Optional[int] = None,
        kv_channels: Optional[int] = None,
        self_attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        enc_dec_attn_mask_type: str = "no_mask",
        enc_dec_window_size: Optional[Tuple[int, int]] = None,
        apply_residual_connection_post_layernorm: bool = False,
        output_layernorm: bool = False,
        layer_type: str = "encoder",
        normalization: str = "LayerNorm",
        activation: str = "gelu",
        bias: bool = True,
        fuse_qkv_params: bool = False,
        qkv_format: str = "sbhd",
        softmax_type: str = "vanilla",
        softcap: float = 0.0,
        apply_query_key_layer_scaling: bool = False,
        device=None,
        params_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        if layer_type not in ("encoder", "decoder"):
            raise errors.invalid("layer_type", f"must be 'encoder' or 'decoder', got "
                                 f"{layer_type!r}")
        if activation not in _ACTIVATIONS:
            raise errors.invalid("activation", f"must be one of {', '.join(_ACTIVATIONS)}, "
                                 f"got {activation!r}")
        self.layer_type = layer_type
        self.output_layernorm = output_layernorm
        self.apply_residual_connection_post_layernorm = apply_residual_connection_post_layernorm
        self.hidden_dropout = float(hidden_dropout)
        factory = dict(device=device, params_dtype=params_dtype)
        shared = dict(num_gqa_groups=num_gqa_groups, kv_channels=kv_channels,
                      attention_dropout=attention_dropout, layer_number=layer_number,
                      bias=bias, fuse_qkv_params=fuse_qkv_params, qkv_format=qkv_format,
                      softmax_type=softmax_type, softcap=softcap,
                      apply_query_key_layer_scaling=apply_query_key_layer_scaling, **factory)
        self.self_attention = MultiheadAttention(
            hidden_size, num_attention_heads, attn_mask_type=self_attn_mask_type,
            window_size=window_size, attention_type="self", **shared)
        self.inter_attention = (MultiheadAttention(
            hidden_size, num_attention_heads, attn_mask_type=enc_dec_attn_mask_type,
            window_size=enc_dec_window_size, attention_type="cross", **shared)
            if layer_type == "decoder" else None)
        norm = dict(device=device, dtype=params_dtype)
        self.self_attention_norm = make_norm(normalization, hidden_size, layernorm_epsilon, **norm)
        self.inter_attention_norm = (make_norm(normalization, hidden_size, layernorm_epsilon,
                                               **norm) if layer_type == "decoder" else None)
        self.mlp_norm = make_norm(normalization, hidden_size, layernorm_epsilon, **norm)
        self.activation, gated = _ACTIVATIONS[activation]
        linear = dict(device=device, dtype=params_dtype)
        self.fc1 = nn.Linear(hidden_size, ffn_hidden_size * (2 if gated else 1), bias=bias,
                             **linear)
        self.gated = gated
        self.fc2 = nn.Linear(ffn_hidden_size, hidden_size, bias=bias, **linear)

    def attention_modules(self):
        """The layer's attentions: self, and cross for a decoder."""
        return [m for m in (self.self_attention, self.inter_attention) if m is not None]

    def _mlp(self, x):
        h = self.fc1(x)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)
            h = self.activation(gate) * value
        else:
            h = self.activation(h)
        return self.fc2(h)

    def _sublayer(self, x, norm, run):
        """One residual block: pre-norm x + f(norm(x)) (the residual is norm(x) with
        apply_residual_connection_post_layernorm), or post-norm norm(x + f(x))."""
        drop = lambda y: F.dropout(y, p=self.hidden_dropout, training=self.training)  # noqa: E731
        if self.output_layernorm:
            return norm(x + drop(run(x)))
        normed = norm(x)
        residual = normed if self.apply_residual_connection_post_layernorm else x
        return residual + drop(run(normed))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        self_attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        encoder_output: Optional[torch.Tensor] = None,
        enc_dec_attn_mask: Optional[torch.Tensor] = None,
        enc_dec_attn_mask_type: Optional[str] = None,
        enc_dec_window_size: Optional[Tuple[int, int]] = None,
        *,
        rotary_pos_emb=None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        alibi_slopes: Optional[torch.Tensor] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        softcap: Optional[float] = None,
        softmax_type: Optional[str] = None,
    ) -> torch.Tensor:
        """TE's forward (its other arguments are not taken: keyword-only after
        ``enc_dec_window_size``); ``softcap`` and ``softmax_type`` override both attentions'
        for this call. ``cu_seqlens_q`` / ``cu_seqlens_kv`` describe the self-attention's
        sequences (thd); the cross-attention takes ``cu_seqlens_q`` for its queries and
        ``cu_seqlens_kv`` for the encoder's rows."""
        if self.layer_type == "decoder" and encoder_output is None:
            raise errors.invalid("encoder_output", "is required by a decoder layer")
        if self.layer_type == "encoder" and encoder_output is not None:
            raise errors.invalid("encoder_output", "is given to an encoder layer")
        overrides = dict(softcap=softcap, softmax_type=softmax_type)
        x = self._sublayer(hidden_states, self.self_attention_norm, lambda h: self.self_attention(
            h, attention_mask, attn_mask_type=self_attn_mask_type, window_size=window_size,
            rotary_pos_emb=rotary_pos_emb, core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes,
            cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_q, **overrides))
        if self.inter_attention is not None:
            x = self._sublayer(x, self.inter_attention_norm, lambda h: self.inter_attention(
                h, enc_dec_attn_mask, encoder_output, attn_mask_type=enc_dec_attn_mask_type,
                window_size=enc_dec_window_size, cu_seqlens_q=cu_seqlens_q,
                cu_seqlens_kv=cu_seqlens_kv, max_seqlen_q=max_seqlen_q,
                max_seqlen_kv=max_seqlen_kv, **overrides))
        return self._sublayer(x, self.mlp_norm, self._mlp)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream=None,
                                   cp_comm_type="p2p", **kwargs):
        """Context parallelism for every attention of the layer."""
        for attention in self.attention_modules():
            attention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream,
                                                 cp_comm_type, **kwargs)
