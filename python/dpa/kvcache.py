"""``dpa.attention_with_kvcache``: decode and chunked prefill over a KV cache (docs/kvcache.md).

FlashAttention's ``flash_attn_with_kvcache`` layout and names: q [b, sq, H, d] (or packed
[tq, H, d] with ``cu_seqlens_q``), a contiguous cache [b, s_max, G, d] or a paged one
[num_pages, page_size, G, d] with ``block_table`` [b, max_pages], ``cache_seqlens`` [b], and new
keys and values appended into the cache before the attention reads them. Every forward feature
of ``dpa.attention``: causal (bottom-right), window, soft-cap, sinks, ALiBi, scale, the LSE.

The cache is written in place, so the call has no backward: it refuses inputs that require grad
while grad mode is on (run it under ``torch.no_grad()`` or ``torch.inference_mode()``).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _dpa, errors
from ._views import allocator_for, stream_of, view
from .functional import (_check_sinks, _require_tensors, _scale, _softcap, _softmax_type,
                         _window)

_KVCACHES = {}


def _engine(causal, window_left, window_right, softcap, scale, softmax_type, backend):
    key = (causal, window_left, window_right, softcap, scale, softmax_type, backend)
    engine = _KVCACHES.get(key)
    if engine is None:
        engine = _dpa.KvCache(_dpa.make_kvcache_config(
            causal=causal, window_left=window_left, window_right=window_right, softcap=softcap,
            softmax_scale=scale, softmax_type=softmax_type, backend=backend))
        _KVCACHES[key] = engine
    return engine


def _outputs(q, v_cache):
    """o like q with v's head dim; the LSE fp32 [b, H, sq], or [H, tq] for a packed q."""
    o = q.new_empty((*q.shape[:-1], v_cache.shape[-1]))
    heads = q.shape[-2]
    shape = (heads, q.shape[0]) if q.dim() == 3 else (q.shape[0], heads, q.shape[1])
    return o, torch.empty(shape, dtype=torch.float32, device=q.device)


# A custom op that writes the caches in place (mutates_args), so that torch.compile traces the
# call whole, with the append ordered against the caches' other uses.
@torch.library.custom_op("dpa::kvcache_forward", mutates_args=("k_cache", "v_cache"))
def _kvcache_forward(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    k_new: Optional[Tensor],
    v_new: Optional[Tensor],
    cache_seqlens: Tensor,
    block_table: Optional[Tensor],
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k_new: Optional[Tensor],
    alibi_slopes: Optional[Tensor],
    sinks: Optional[Tensor],
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    softmax_scale: Optional[float],
    softmax_type: str,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    o, lse = _outputs(q, v_cache)
    _engine(causal, window_left, window_right, softcap, softmax_scale, softmax_type,
            backend).forward(
        view(q, "q"), view(cu_seqlens_q, "cu_seqlens_q"), view(k_cache, "k_cache"),
        view(v_cache, "v_cache"), view(block_table, "block_table"),
        view(cache_seqlens, "cache_seqlens"), view(k_new, "k_new"), view(v_new, "v_new"),
        view(cu_seqlens_k_new, "cu_seqlens_k_new"), view(alibi_slopes, "alibi_slopes"),
        view(sinks, "sinks"), view(o, "o"), view(lse, "lse"), stream_of(q), allocator_for(q))
    return o, lse


@_kvcache_forward.register_fake
def _kvcache_forward_fake(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table,
                          cu_seqlens_q, cu_seqlens_k_new, alibi_slopes, sinks, causal,
                          window_left, window_right, softcap, softmax_scale, softmax_type,
                          backend):
    return _outputs(q, v_cache)


def _seqlens(cache_seqlens, batch, device):
    if isinstance(cache_seqlens, bool):
        raise errors.invalid("cache_seqlens", "must be an int or an int32 tensor [b], got a bool")
    if isinstance(cache_seqlens, int):
        return torch.full((batch,), cache_seqlens, dtype=torch.int32, device=device)
    return cache_seqlens


def attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    k_new=None,
    v_new=None,
    *,
    cache_seqlens,
    block_table=None,
    cu_seqlens_q=None,
    cu_seqlens_k_new=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    sinks=None,
    softmax_type: Optional[str] = None,
    return_lse=False,
    backend: Optional[str] = None,
):
    """o [b, sq, H, dv] (or [tq, H, dv]); with ``return_lse``, (o, lse) with lse fp32 [b, H, sq]
    (or [H, tq]). ``k_new`` / ``v_new`` ([b, s_new, G, d], or packed [t_new, G, d] with
    ``cu_seqlens_k_new``) are written into the cache at positions ``cache_seqlens[i]`` onward
    first; ``cache_seqlens`` counts the tokens before them (an int for every sequence, or an
    int32 tensor [b])."""
    _require_tensors(q=q, k_cache=k_cache, v_cache=v_cache, k_new=k_new, v_new=v_new,
                     block_table=block_table, cu_seqlens_q=cu_seqlens_q,
                     cu_seqlens_k_new=cu_seqlens_k_new, alibi_slopes=alibi_slopes, sinks=sinks)
    if torch.is_grad_enabled():
        for name, tensor in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache),
                             ("k_new", k_new), ("v_new", v_new), ("sinks", sinks),
                             ("alibi_slopes", alibi_slopes)):
            if tensor is not None and tensor.requires_grad:
                raise errors.invalid(name, "requires grad, but attention_with_kvcache has no "
                                     "backward (it writes the cache in place): call it under "
                                     "torch.no_grad() or torch.inference_mode()",
                                     errors.NotSupportedError)
    left, right = _window(window_size)
    softmax_type = _softmax_type(softmax_type, sinks)
    _check_sinks(sinks, q)
    batch = q.shape[0] if cu_seqlens_q is None else cu_seqlens_q.shape[0] - 1
    cache_seqlens = _seqlens(cache_seqlens, batch, q.device)
    _require_tensors(cache_seqlens=cache_seqlens)
    o, lse = _kvcache_forward(q, k_cache, v_cache, k_new, v_new, cache_seqlens, block_table,
                              cu_seqlens_q, cu_seqlens_k_new, alibi_slopes, sinks, bool(causal),
                              left, right, _softcap(softcap), _scale(softmax_scale),
                              softmax_type, backend or "auto")
    return (o, lse) if return_lse else o


__all__ = ["attention_with_kvcache"]
