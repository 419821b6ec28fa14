"""dpa.torch.DotProductAttention: a drop-in for TransformerEngine's DotProductAttention.

Constructor and forward take TE's argument names; the output merges the heads as TE's does
([sq, b, H * dv] for sbhd, [b, sq, H * dv] for bshd, [t, H * dv] for thd). The learnable sink
is the nn.Parameter ``softmax_offset`` [H] (fp32). Masks use TE's names and alignment:
``causal`` is top-left, ``causal_bottom_right`` bottom-right.
"""

import math
from typing import Optional, Tuple, Union

import torch
from torch import nn

from .. import errors, export_graph
from ..functional import _require_tensors, _run, resolve
from .context_parallel import context_parallel_group, cp_attention

# TE's core_attention_bias_type names -> dpa's bias types (alibi is not a bias type in dpa:
# it is switched on by passing slopes).
_BIAS_TYPES = {"no_bias": "no_bias", "pre_scale_bias": "pre_scale",
               "post_scale_bias": "post_scale", "alibi": "no_bias"}


def default_alibi_slopes(num_heads: int, device=None) -> torch.Tensor:
    """The ALiBi paper's slopes, fp32 [H]: 2^(-8 i / n) for the nearest power of two n, the
    odd multiples of the next power interleaved beyond it (as TE builds them when given none)."""
    closest = 2 ** math.floor(math.log2(num_heads))
    base = [2.0 ** (-8.0 * (i + 1) / closest) for i in range(closest)]
    if closest < num_heads:
        extra = [2.0 ** (-4.0 * (i + 1) / closest) for i in range(2 * closest)][0::2]
        base += extra[: num_heads - closest]
    return torch.tensor(base, dtype=torch.float32, device=device)


class DotProductAttention(nn.Module):
    def __init__(
        self,
        num_attention_heads: int,
        kv_channels: Union[int, Tuple[int, int]],
        num_gqa_groups: Optional[int] = None,
        attention_dropout: float = 0.0,
        qkv_format: str = "sbhd",
        attn_mask_type: str = "causal",
        window_size: Optional[Tuple[int, int]] = None,
        softmax_type: str = "vanilla",
        softcap: float = 0.0,
        layer_number: Optional[int] = None,
        softmax_scale: Optional[float] = None,
        deterministic: bool = False,
        bottom_right_diagonal: Optional[bool] = None,
        backend: Optional[str] = None,
    ):
        super().__init__()
        if num_attention_heads <= 0:
            raise errors.invalid("num_attention_heads", f"must be > 0, got {num_attention_heads}")
        self.num_attention_heads = num_attention_heads
        self.num_gqa_groups = num_gqa_groups or num_attention_heads
        if num_attention_heads % self.num_gqa_groups != 0:
            raise errors.invalid("num_gqa_groups", f"{self.num_gqa_groups} does not divide "
                                 f"num_attention_heads {num_attention_heads}")
        if isinstance(kv_channels, int):
            kv_channels = (kv_channels, kv_channels)
        self.kv_channels = tuple(kv_channels)
        self.attention_dropout = float(attention_dropout)
        self.qkv_format = qkv_format
        self.attn_mask_type = attn_mask_type
        self.window_size = window_size
        self.softmax_type = softmax_type
        self.softcap = float(softcap)
        self.layer_number = layer_number
        self.softmax_scale = softmax_scale
        self.deterministic = deterministic
        self.bottom_right_diagonal = bottom_right_diagonal
        self.backend = backend
        if softmax_type == "learnable":
            self.softmax_offset = nn.Parameter(
                torch.zeros(num_attention_heads, dtype=torch.float32))
        else:
            self.register_parameter("softmax_offset", None)
        self.cp = None  # set_context_parallel_group
        # Fail at construction, not at the first call: resolving checks every name.
        self._resolve(qkv_format, attn_mask_type, window_size, "no_bias", None)

    def _resolve(self, qkv_format, attn_mask_type, window_size, bias_type, bias, softcap=None,
                 softmax_type=None):
        if window_size is None:
            causal = "causal" in attn_mask_type
            window_size = (-1, 0) if causal else (-1, -1)
        softmax_type, sinks = self._softmax(softmax_type)
        return resolve(
            qkv_format=qkv_format, causal=False, mask_type=attn_mask_type,
            window_size=window_size, bottom_right_diagonal=self.bottom_right_diagonal,
            softcap=self.softcap if softcap is None else softcap,
            softmax_scale=self.softmax_scale, softmax_type=softmax_type, sinks=sinks, bias=bias,
            bias_type=bias_type, dropout_p=self.attention_dropout if self.training else 0.0,
            layer_number=self.layer_number, deterministic=self.deterministic,
            backend=self.backend, padded=False)

    def _softmax(self, softmax_type):
        """The call's softmax type and sink tensor: the constructor's, or a per-call override
        between the parameter-free types ("vanilla", "off-by-one"). "learnable" needs the
        layer's softmax_offset parameter, so only a layer built with it can use it."""
        if softmax_type is None or softmax_type == self.softmax_type:
            return self.softmax_type, self.softmax_offset
        if softmax_type == "learnable":
            raise errors.invalid("softmax_type", "is 'learnable' but the layer was built with "
                                 f"{self.softmax_type!r} (it has no softmax_offset parameter)")
        return softmax_type, None

    def forward(
        self,
        query_layer: torch.Tensor,
        key_layer: torch.Tensor,
        value_layer: torch.Tensor,
        attention_mask: Optional[torch.Tensor] = None,
        qkv_format: Optional[str] = None,
        cu_seqlens_q: Optional[torch.Tensor] = None,
        cu_seqlens_kv: Optional[torch.Tensor] = None,
        cu_seqlens_q_padded: Optional[torch.Tensor] = None,
        cu_seqlens_kv_padded: Optional[torch.Tensor] = None,
        max_seqlen_q: Optional[int] = None,
        max_seqlen_kv: Optional[int] = None,
        attn_mask_type: Optional[str] = None,
        window_size: Optional[Tuple[int, int]] = None,
        core_attention_bias_type: str = "no_bias",
        core_attention_bias: Optional[torch.Tensor] = None,
        alibi_slopes: Optional[torch.Tensor] = None,
        softcap: Optional[float] = None,
        softmax_type: Optional[str] = None,
    ) -> torch.Tensor:
        """TE's forward; ``softcap`` and ``softmax_type`` (dpa's additions, last so that
        positional callers are not broken) override the constructor's for this call."""
        qkv_format = qkv_format or self.qkv_format
        self._check_sizes(query_layer, key_layer, value_layer)
        attn_mask_type = attn_mask_type or self.attn_mask_type
        if window_size is None:
            window_size = self.window_size
        if core_attention_bias_type not in _BIAS_TYPES:
            raise errors.invalid("core_attention_bias_type",
                                 f"must be one of {', '.join(_BIAS_TYPES)}, "
                                 f"got {core_attention_bias_type!r}")
        if core_attention_bias_type == "alibi":
            if core_attention_bias is not None:
                raise errors.invalid("core_attention_bias", "is given with bias type 'alibi' "
                                     "(pass alibi_slopes instead)")
            if alibi_slopes is None:
                alibi_slopes = default_alibi_slopes(self.num_attention_heads, query_layer.device)
        elif alibi_slopes is not None:
            raise errors.invalid("alibi_slopes", "is given but core_attention_bias_type is "
                                 f"{core_attention_bias_type!r}")
        if attention_mask is not None and attn_mask_type != "arbitrary":
            raise errors.invalid("attention_mask", "is given but attn_mask_type is "
                                 f"{attn_mask_type!r} (dpa reads padding from cu_seqlens)")
        self._check_max_seqlen(query_layer, qkv_format, max_seqlen_q, cu_seqlens_q,
                               "max_seqlen_q")
        self._check_max_seqlen(key_layer, qkv_format, max_seqlen_kv, cu_seqlens_kv,
                               "max_seqlen_kv")
        config = self._resolve(qkv_format, attn_mask_type, window_size,
                               _BIAS_TYPES[core_attention_bias_type], core_attention_bias,
                               softcap, softmax_type)
        sinks = self._softmax(softmax_type)[1]
        if self.cp is not None and self.cp.size > 1:
            if export_graph.exporting():
                raise errors.invalid("cp_group", "is set while exporting to ONNX: a graph of "
                                     "one device cannot express the ranks' exchange",
                                     errors.NotSupportedError)
            return self._context_parallel(query_layer, key_layer, value_layer, config,
                                          cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                                          cu_seqlens_kv_padded, core_attention_bias,
                                          alibi_slopes, attention_mask, sinks)
        o = _run(query_layer, key_layer, value_layer, config, cu_seqlens_q=cu_seqlens_q,
                 cu_seqlens_kv=cu_seqlens_kv, cu_seqlens_q_padded=cu_seqlens_q_padded,
                 cu_seqlens_kv_padded=cu_seqlens_kv_padded, bias=core_attention_bias,
                 alibi_slopes=alibi_slopes, sinks=sinks, attn_mask=attention_mask)
        return o.flatten(-2)

    def set_context_parallel_group(self, cp_group, cp_global_ranks, cp_stream=None,
                                   cp_comm_type="p2p", *, cp_a2a_group_size=0,
                                   communicator="auto"):
        """Runs this layer's attention with context parallelism over `cp_group` (TE's
        signature). Inputs are then this rank's shards in the dual-chunk layout
        (dpa.torch.shard_sequence). cp_comm_type: p2p, all_gather, a2a or a2a+p2p (with
        cp_a2a_group_size ranks per all-to-all group). communicator: "auto" takes dpa's NCCL
        communicator for CUDA tensors when built with NCCL (bootstrapped through the group),
        else the group's own collectives over host buffers; "nccl" or "torch" force one.
        cp_stream: the stream the NCCL communicator enqueues on. None as the group turns it
        off."""
        if cp_group is None:
            self.cp = None
            return
        self.cp = context_parallel_group(cp_group, cp_global_ranks, cp_comm_type, cp_stream,
                                         cp_a2a_group_size, communicator)

    def _context_parallel(self, q, k, v, config, cu_seqlens_q, cu_seqlens_kv,
                          cu_seqlens_q_padded, cu_seqlens_kv_padded, bias, alibi_slopes,
                          attn_mask, sinks):
        _require_tensors(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                         cu_seqlens_q_padded=cu_seqlens_q_padded,
                         cu_seqlens_kv_padded=cu_seqlens_kv_padded, bias=bias,
                         alibi_slopes=alibi_slopes, attn_mask=attn_mask)
        if config.dropout_p > 0:
            # Every rank must draw the same mask of the unsharded sequence (DESIGN.md §5).
            seed = [int(torch.randint(0, 2**62, (1,)))]
            torch.distributed.broadcast_object_list(seed, src=self.cp.global_ranks[0],
                                                    group=self.cp.group)
            rng = torch.tensor([seed[0], 0], dtype=torch.int64)
        else:
            rng = None
        inputs = (q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                  cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng,
                  *config)
        o, _ = cp_attention(self.cp, inputs)
        return o.flatten(-2)

    def _check_sizes(self, q, k, v):
        """The constructor's sizes must be the tensors' (TE asserts the same)."""
        for tensor, name, heads, dim in (
                (q, "query_layer", self.num_attention_heads, self.kv_channels[0]),
                (k, "key_layer", self.num_gqa_groups, self.kv_channels[0]),
                (v, "value_layer", self.num_gqa_groups, self.kv_channels[1])):
            if not isinstance(tensor, torch.Tensor) or tensor.dim() < 2:
                continue  # the call's own checks name it
            if tensor.shape[-2] != heads or tensor.shape[-1] != dim:
                raise errors.invalid(name, f"has {tensor.shape[-2]} heads of {tensor.shape[-1]}, "
                                     f"the layer was built for {heads} of {dim}")

    @staticmethod
    def _check_max_seqlen(tensor, qkv_format, max_seqlen, cu_seqlens, name):
        """TE's max_seqlen_* are the padded sequence axis for bshd/sbhd; dpa reads it from the
        tensor, so a given value must agree with it (thd: see attention_varlen)."""
        if max_seqlen is None:
            return
        if qkv_format in ("bshd", "sbhd"):
            axis = 1 if qkv_format == "bshd" else 0
            if max_seqlen != tensor.shape[axis]:
                raise errors.invalid(name, f"is {max_seqlen}, but the tensor's sequence axis "
                                     f"has {tensor.shape[axis]}")
        elif isinstance(cu_seqlens, torch.Tensor) and not cu_seqlens.is_cuda:
            if cu_seqlens.numel() >= 2:
                longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
                if longest > max_seqlen:
                    raise errors.invalid(name, f"is {max_seqlen}, but a sequence has "
                                         f"{longest} rows")

    def extra_repr(self):
        return (f"heads={self.num_attention_heads}, gqa_groups={self.num_gqa_groups}, "
                f"kv_channels={self.kv_channels}, qkv_format={self.qkv_format}, "
                f"attn_mask_type={self.attn_mask_type}, softmax_type={self.softmax_type}, "
                f"softcap={self.softcap}")
