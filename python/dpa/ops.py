"""The torch.library custom ops ``dpa::forward`` and ``dpa::backward`` (DESIGN.md §11).

Both allocate their outputs with the caller's allocator (torch.empty: PyTorch's caching
allocator on CUDA), run on the caller's current stream, and never synchronise. Their fake
implementations give the exact output shapes, so torch.compile traces through them with no
graph break; ``register_autograd`` wires the backward to autograd. The config travels as plain
arguments (strings, ints, floats) so that the schema is the whole contract.
"""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _dpa
from ._views import allocator_for, stream_of, view

# One extension object per distinct config; dropout state is passed per call, never drawn from
# the object, so sharing it is safe.
_ATTENTIONS = {}


def make_config(config):
    """The extension's Config from the op's config arguments (Resolved's order)."""
    return _dpa.make_config(
        qkv_format=config[0], mask_type=config[1], window_left=config[2],
        window_right=config[3], bottom_right_diagonal=config[4], softcap=config[5],
        softmax_scale=config[6], softmax_type=config[7], bias_type=config[8],
        dropout=config[9], seed=0, layer_number=config[10], deterministic=config[11],
        backend=config[12])


def _attention(config):
    attention = _ATTENTIONS.get(config)
    if attention is None:
        attention = _dpa.Attention(make_config(config))
        _ATTENTIONS[config] = attention
    return attention


def _rng(rng):
    """(seed, offset) from the int64 [2] host tensor, or None without dropout."""
    if rng is None:
        return None
    seed, offset = rng.tolist()
    return (seed & 0xFFFFFFFFFFFFFFFF, offset & 0xFFFFFFFFFFFFFFFF)


def lse_shape(q: Tensor, qkv_format: str) -> List[int]:
    """fp32 [b, H, sq] (bshd, sbhd) or [H, tq] (thd), DESIGN.md §2."""
    if qkv_format == "bshd":
        return [q.shape[0], q.shape[2], q.shape[1]]
    if qkv_format == "sbhd":
        return [q.shape[1], q.shape[2], q.shape[0]]
    return [q.shape[1], q.shape[0]]


def _output_shape(q: Tensor, v: Tensor) -> List[int]:
    return list(q.shape[:-1]) + [v.shape[-1]]


def forward_outputs(q: Tensor, v: Tensor, qkv_format: str) -> Tuple[Tensor, Tensor]:
    """o and lse, allocated by the caller's allocator: for the run and its fake alike."""
    o = q.new_empty(_output_shape(q, v))
    lse = torch.empty(lse_shape(q, qkv_format), dtype=torch.float32, device=q.device)
    return o, lse


def backward_outputs(q, k, v, bias, sinks, wants_dbias, wants_dsinks):
    """dq, dk, dv, dbias, dsinks for the run and its fake alike; dbias and dsinks are empty
    when not wanted, and dbias is contiguous whatever the bias's strides (the library writes
    it densely)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dbias = (torch.empty(bias.shape, dtype=bias.dtype, device=bias.device) if wants_dbias
             else q.new_empty([0]))
    dsinks = torch.empty_like(sinks) if wants_dsinks else q.new_empty([0], dtype=torch.float32)
    return dq, dk, dv, dbias, dsinks


def forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
                 bias, alibi_slopes, sinks, attn_mask, rng, qkv_format, mask_type, window_left,
                 window_right, bottom_right_diagonal, softcap, softmax_scale, softmax_type,
                 bias_type, dropout_p, layer_number, deterministic, backend, engine=None):
    """The forward itself: what the custom op, the eager autograd path and the no-grad path
    all run. `engine`: a context-parallel engine instead of the config's attention object."""
    config = (qkv_format, mask_type, window_left, window_right, bottom_right_diagonal, softcap,
              softmax_scale, softmax_type, bias_type, dropout_p, layer_number, deterministic,
              backend)
    o, lse = forward_outputs(q, v, qkv_format)
    (_attention(config) if engine is None else engine).forward(
        view(q, "q"), view(k, "k"), view(v, "v"), view(o, "o"), view(lse, "lse"),
        view(cu_seqlens_q, "cu_seqlens_q"), view(cu_seqlens_kv, "cu_seqlens_kv"),
        view(cu_seqlens_q_padded, "cu_seqlens_q_padded"),
        view(cu_seqlens_kv_padded, "cu_seqlens_kv_padded"), view(bias, "bias"),
        view(alibi_slopes, "alibi_slopes"), view(sinks, "sinks"), view(attn_mask, "attn_mask"),
        dropout_p, _rng(rng), stream_of(q), allocator_for(q))
    return o, lse


@torch.library.custom_op("dpa::forward", mutates_args=())
def forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_kv: Optional[Tensor],
    cu_seqlens_q_padded: Optional[Tensor],
    cu_seqlens_kv_padded: Optional[Tensor],
    bias: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    sinks: Optional[Tensor],
    attn_mask: Optional[Tensor],
    rng: Optional[Tensor],
    qkv_format: str,
    mask_type: str,
    window_left: int,
    window_right: int,
    bottom_right_diagonal: bool,
    softcap: float,
    softmax_scale: Optional[float],
    softmax_type: str,
    bias_type: str,
    dropout_p: float,
    layer_number: int,
    deterministic: bool,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    return forward_impl(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                        cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng,
                        qkv_format, mask_type, window_left, window_right, bottom_right_diagonal,
                        softcap, softmax_scale, softmax_type, bias_type, dropout_p, layer_number,
                        deterministic, backend)


@forward.register_fake
def _forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                  cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng, qkv_format,
                  mask_type, window_left, window_right, bottom_right_diagonal, softcap,
                  softmax_scale, softmax_type, bias_type, dropout_p, layer_number, deterministic,
                  backend):
    return forward_outputs(q, v, qkv_format)


def backward_impl(d_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                  cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng, qkv_format,
                  mask_type, window_left, window_right, bottom_right_diagonal, softcap,
                  softmax_scale, softmax_type, bias_type, dropout_p, layer_number, deterministic,
                  backend, wants_dbias, wants_dsinks, engine=None):
    """Returns (dq, dk, dv, dbias, dsinks); dbias and dsinks are empty when not wanted."""
    config = (qkv_format, mask_type, window_left, window_right, bottom_right_diagonal, softcap,
              softmax_scale, softmax_type, bias_type, dropout_p, layer_number, deterministic,
              backend)
    dq, dk, dv, dbias, dsinks = backward_outputs(q, k, v, bias, sinks, wants_dbias, wants_dsinks)
    (_attention(config) if engine is None else engine).backward(
        view(q, "q"), view(k, "k"), view(v, "v"), view(o, "o"), view(lse, "lse"),
        view(d_o, "d_o"), view(dq, "dq"), view(dk, "dk"), view(dv, "dv"),
        view(dbias, "dbias") if wants_dbias else None,
        view(dsinks, "dsinks") if wants_dsinks else None,
        view(cu_seqlens_q, "cu_seqlens_q"), view(cu_seqlens_kv, "cu_seqlens_kv"),
        view(cu_seqlens_q_padded, "cu_seqlens_q_padded"),
        view(cu_seqlens_kv_padded, "cu_seqlens_kv_padded"), view(bias, "bias"),
        view(alibi_slopes, "alibi_slopes"), view(sinks, "sinks"), view(attn_mask, "attn_mask"),
        dropout_p, _rng(rng), stream_of(q), allocator_for(q))
    return dq, dk, dv, dbias, dsinks


@torch.library.custom_op("dpa::backward", mutates_args=())
def backward(
    d_o: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_kv: Optional[Tensor],
    cu_seqlens_q_padded: Optional[Tensor],
    cu_seqlens_kv_padded: Optional[Tensor],
    bias: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    sinks: Optional[Tensor],
    attn_mask: Optional[Tensor],
    rng: Optional[Tensor],
    qkv_format: str,
    mask_type: str,
    window_left: int,
    window_right: int,
    bottom_right_diagonal: bool,
    softcap: float,
    softmax_scale: Optional[float],
    softmax_type: str,
    bias_type: str,
    dropout_p: float,
    layer_number: int,
    deterministic: bool,
    backend: str,
    wants_dbias: bool,
    wants_dsinks: bool,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    return backward_impl(d_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                         cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng,
                         qkv_format, mask_type, window_left, window_right,
                         bottom_right_diagonal, softcap, softmax_scale, softmax_type, bias_type,
                         dropout_p, layer_number, deterministic, backend, wants_dbias,
                         wants_dsinks)


@backward.register_fake
def _backward_fake(d_o, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded,
                   cu_seqlens_kv_padded, bias, alibi_slopes, sinks, attn_mask, rng, qkv_format,
                   mask_type, window_left, window_right, bottom_right_diagonal, softcap,
                   softmax_scale, softmax_type, bias_type, dropout_p, layer_number,
                   deterministic, backend, wants_dbias, wants_dsinks):
    return backward_outputs(q, k, v, bias, sinks, wants_dbias, wants_dsinks)


# Indices of the forward's inputs.
_TENSOR_INPUTS = 12  # q .. rng
_BIAS, _SINKS = 7, 9


def _setup_context(ctx, inputs, output):
    o, lse = output
    ctx.save_for_backward(*inputs[:_TENSOR_INPUTS], o, lse)
    ctx.config = inputs[_TENSOR_INPUTS:]
    ctx.wants_dbias = inputs[_BIAS] is not None and ctx.needs_input_grad[_BIAS]
    ctx.wants_dsinks = inputs[_SINKS] is not None and ctx.needs_input_grad[_SINKS]
    # lse is a by-product, as in FlashAttention: its gradient is not computed, and autograd
    # says so (lse.requires_grad is False) instead of dropping a gradient silently.
    ctx.mark_non_differentiable(lse)


def _gradients(ctx, d_o, run_backward):
    saved = ctx.saved_tensors
    inputs, o, lse = saved[:_TENSOR_INPUTS], saved[_TENSOR_INPUTS], saved[_TENSOR_INPUTS + 1]
    q, k, v = inputs[0], inputs[1], inputs[2]
    if d_o.stride(-1) != 1:  # autograd may hand an expanded (stride 0) gradient
        d_o = d_o.contiguous()
    dq, dk, dv, dbias, dsinks = run_backward(
        d_o, q, k, v, o, lse, *inputs[3:], *ctx.config, ctx.wants_dbias, ctx.wants_dsinks)
    grads = [dq, dk, dv] + [None] * (_TENSOR_INPUTS - 3) + [None] * len(ctx.config)
    if ctx.wants_dbias:
        grads[_BIAS] = dbias
    if ctx.wants_dsinks:
        grads[_SINKS] = dsinks
    return tuple(grads)


def _backward(ctx, d_o, d_lse):
    return _gradients(ctx, d_o, backward)


forward.register_autograd(_backward, setup_context=_setup_context)


class EagerAttention(torch.autograd.Function):
    """The same forward and backward outside torch.compile, without the dispatcher's cost per
    call (docs/perf.md): the custom ops serve tracing, this serves eager training."""

    @staticmethod
    def forward(*inputs):
        return forward_impl(*inputs)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_o, d_lse):
        # The kernels' gradients have no graph of their own: a double backward raises instead
        # of silently missing terms (the custom op refuses it too).
        return _gradients(ctx, d_o, backward_impl)
