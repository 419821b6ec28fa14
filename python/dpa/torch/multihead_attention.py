"""dpa.torch.MultiheadAttention: TransformerEngine's MultiheadAttention on dpa's core attention.

The projections (one fused QKV weight or separate ones; for cross-attention, queries from
``hidden_states`` and keys / values from ``encoder_output``), an optional input norm, rotary
embeddings passed in (``rotary_pos_emb``), the core attention (``self.core_attention``, a
``dpa.torch.DotProductAttention``) and the output projection. Every attention feature is a
constructor argument stored on the module; the forward's ``attn_mask_type``, ``window_size``,
``softcap`` and ``softmax_type`` override it for one call and fall back to it when None.
"""

from typing import Optional, Tuple, Union

import torch
from torch import nn

from .. import errors
from .dot_product_attention import DotProductAttention
from .rotary import apply_rotary_pos_emb

_NORMALIZATIONS = ("LayerNorm", "RMSNorm")


def make_norm(normalization: str, hidden_size: int, eps: float, device=None, dtype=None):
    """TE's ``normalization`` names: LayerNorm or RMSNorm over the last axis."""
    if normalization == "LayerNorm":
        return nn.LayerNorm(hidden_size, eps=eps, device=device, dtype=dtype)
    if normalization == "RMSNorm":
        return nn.RMSNorm(hidden_size, eps=eps, device=device, dtype=dtype)
    raise errors.invalid("normalization", f"must be one of {', '.join(_NORMALIZATIONS)}, "
                         f"got {normalization!r}")


class MultiheadAttention(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        num_attention_heads: int,
        kv_channels: Optional[Union[int, Tuple[int, int]]] = None,
        attention_dropout: float = 0.1,
        layernorm_epsilon: float = 1e-5,
        layer_number: Optional[int] = None,
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        num_gqa_groups: Optional[int] = None,
        attention_type: str = "self",
        input_layernorm: bool = False,
        normalization: str = "LayerNorm",
        bias: bool = True,
        fuse_qkv_params: bool = False,
        qkv_format: str = "sbhd",
        softmax_type: str = "vanilla",
        softcap: float = 0.0,
        apply_query_key_layer_scaling: bool = False,
        softmax_scale: Optional[float] = None,
        device=None,
        params_dtype: Optional[torch.dtype] = None,
    ):
        super().__init__()
        if attention_type not in ("self", "cross"):
            raise errors.invalid("attention_type", f"must be 'self' or 'cross', got "
                                 f"{attention_type!r}")
        if hidden_size <= 0:
            raise errors.invalid("hidden_size", f"must be > 0, got {hidden_size}")
        if kv_channels is None:
            if hidden_size % num_attention_heads:
                raise errors.invalid("kv_channels", "is required when num_attention_heads "
                                     f"{num_attention_heads} does not divide hidden_size "
                                     f"{hidden_size}")
            kv_channels = hidden_size // num_attention_heads
        dims = (kv_channels, kv_channels) if isinstance(kv_channels, int) else tuple(kv_channels)
        if apply_query_key_layer_scaling and not layer_number:
            raise errors.invalid("layer_number", "is required (>= 1) with "
                                 "apply_query_key_layer_scaling")
        self.hidden_size = hidden_size
        self.attention_type = attention_type
        self.qkv_format = qkv_format
        self.layer_number = layer_number
        self.apply_query_key_layer_scaling = apply_query_key_layer_scaling
        self.fuse_qkv_params = fuse_qkv_params
        # qk-layer-scaling (DESIGN.md §3): the core attention takes the layer number and scales
        # the logits by it and back; without the flag the layer number does not reach it.
        self.core_attention = DotProductAttention(
            num_attention_heads, dims, num_gqa_groups=num_gqa_groups,
            attention_dropout=attention_dropout, qkv_format=qkv_format,
            attn_mask_type=attn_mask_type, window_size=window_size, softmax_type=softmax_type,
            softcap=softcap, softmax_scale=softmax_scale,
            layer_number=layer_number if apply_query_key_layer_scaling else None)
        heads, groups = num_attention_heads, self.core_attention.num_gqa_groups
        self.dims = dims
        factory = dict(device=device, dtype=params_dtype)
        self.layernorm = (make_norm(normalization, hidden_size, layernorm_epsilon, **factory)
                          if input_layernorm else None)
        q_width, k_width, v_width = heads * dims[0], groups * dims[0], groups * dims[1]
        self.qkv = self.query = self.key = self.value = self.key_value = None
        if attention_type == "self" and fuse_qkv_params:
            self.qkv = nn.Linear(hidden_size, q_width + k_width + v_width, bias=bias, **factory)
        else:
            self.query = nn.Linear(hidden_size, q_width, bias=bias, **factory)
            if fuse_qkv_params:
                self.key_value = nn.Linear(hidden_size, k_width + v_width, bias=bias, **factory)
            else:
                self.key = nn.Linear(hidden_size, k_width, bias=bias, **factory)
                self.value = nn.Linear(hidden_size, v_width, bias=bias, **factory)
        self.proj = nn.Linear(heads * dims[1], hidden_size, bias=bias, **factory)

    # The attention features, as stored on the core attention (one copy of each).
    @property
    def softcap(self) -> float:
        return self.core_attention.softcap

    @property
    def window_size(self):
        return self.core_attention.window_size

    @property
    def attn_mask_type(self) -> str:
        return self.core_attention.attn_mask_type

    @property
    def softmax_type(self) -> str:
        return self.core_attention.softmax_type

    def _project(self, hidden_states, encoder_output):
        """q [..., H, dqk], k [..., G, dqk], v [..., G, dv] from the inputs' last axis."""
        attention = self.core_attention
        heads, groups = attention.num_attention_heads, attention.num_gqa_groups
        dqk, dv = self.dims
        lead = hidden_states.shape[:-1]
        if self.qkv is not None:
            q, k, v = self.qkv(hidden_states).split(
                [heads * dqk, groups * dqk, groups * dv], dim=-1)
            kv_lead = lead
        else:
            source = hidden_states if self.attention_type == "self" else encoder_output
            q = self.query(hidden_states)
            if self.key_value is not None:
                k, v = self.key_value(source).split([groups * dqk, groups * dv], dim=-1)
            else:
                k, v = self.key(source), self.value(source)
            kv_lead = source.shape[:-1]
        return (q.reshape(*lead, heads, dqk), k.reshape(*kv_lead, groups, dqk),
                v.reshape(*kv_lead, groups, dv))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        encoder_output: Optional[torch.Tensor] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        *,
        rotary_pos_emb: Optional[Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]] = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        alibi_slopes: Optional[torch.Tensor] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        cu_seqlens_q_padded: Optional[torch.Tensor] = None,
        cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        softcap: Optional[float] = None,
        softmax_type: Optional[str] = None,
    ) -> torch.Tensor:
        """hidden_states [s, b, hidden] (sbhd), [b, s, hidden] (bshd) or [t, hidden] (thd);
        ``encoder_output`` likewise, for cross-attention. Arguments after ``window_size`` are
        keyword-only: TE's forward has arguments dpa does not take there
        (``is_first_microbatch``, ``checkpoint_core_attention``, ``inference_params``), so a
        positional TE call fails instead of binding the wrong ones."""
        if self.attention_type == "cross" and encoder_output is None:
            raise errors.invalid("encoder_output", "is required for cross-attention")
        if self.attention_type == "self" and encoder_output is not None:
            raise errors.invalid("encoder_output", "is given to a self-attention layer")
        if self.layernorm is not None:
            hidden_states = self.layernorm(hidden_states)
        q, k, v = self._project(hidden_states, encoder_output)
        if rotary_pos_emb is not None:
            q_freqs, k_freqs = (rotary_pos_emb if isinstance(rotary_pos_emb, tuple)
                                else (rotary_pos_emb, rotary_pos_emb))
            q = apply_rotary_pos_emb(q, q_freqs, self.qkv_format, cu_seqlens_q)
            k = apply_rotary_pos_emb(k, k_freqs, self.qkv_format,
                                     cu_seqlens_kv if cu_seqlens_kv is not None else cu_seqlens_q)
        o = self.core_attention(
            q, k, v, attention_mask=attention_mask, cu_seqlens_q=cu_seqlens_q,
            cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
            cu_seqlens_kv_padded=cu_seqlens_kv_padded, max_seqlen_q=max_seqlen_q,
            max_seqlen_kv=max_seqlen_kv, attn_mask_type=attn_mask_type, window_size=window_size,
            core_attention_bias_type=core_attention_bias_type,
            core_attention_bias=core_attention_bias, alibi_slopes=alibi_slopes, softcap=softcap,
            softmax_type=softmax_type)
        return self.proj(o)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream=None,
                                   cp_comm_type="p2p", **kwargs):
        """Context parallelism for the core attention (DotProductAttention's signature)."""
        self.core_attention.set_context_parallel_group(cp_group, cp_global_ranks, cp_stream,
                                                       cp_comm_type, **kwargs)

    def extra_repr(self):
        return (f"attention_type={self.attention_type}, fuse_qkv_params={self.fuse_qkv_params}, "
                f"layer_number={self.layer_number}, "
                f"qk_layer_scaling={self.apply_query_key_layer_scaling}")
