"""The functional API: ``dpa.attention``, ``dpa.attention_varlen`` and ``dpa.explain``.

Names follow FlashAttention's ``flash_attn_func`` / ``flash_attn_varlen_func`` where it has
them (docs/python.md maps them to FlashAttention, TransformerEngine and FlexAttention).
Everything here is plain Python that torch.compile traces; the extension is reached only
inside the custom ops (dpa/ops.py).
"""

from typing import NamedTuple, Optional, Tuple

import torch

from . import _dpa, errors, export_graph, ops
from ._views import view

_MASK_TYPES = (
    "no_mask",
    "padding",
    "causal",
    "padding_causal",
    "causal_bottom_right",
    "padding_causal_bottom_right",
    "arbitrary",
)
_CAUSAL = ("causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right")


class Resolved(NamedTuple):
    """One call's config, as the custom ops take it (after q .. rng)."""

    qkv_format: str
    mask_type: str
    window_left: int
    window_right: int
    bottom_right_diagonal: bool
    softcap: float
    softmax_scale: Optional[float]
    softmax_type: str
    bias_type: str
    dropout_p: float
    layer_number: int
    deterministic: bool
    backend: str


def _mask_type(causal, mask_type, padded):
    """FlashAttention's ``causal`` is aligned to the bottom-right corner (sq != skv), so it maps
    to dpa's *_bottom_right masks; ``mask_type`` names a dpa / TE mask directly."""
    if mask_type is None:
        if causal:
            return "padding_causal_bottom_right" if padded else "causal_bottom_right"
        return "padding" if padded else "no_mask"
    if mask_type not in _MASK_TYPES:
        raise errors.invalid("mask_type", f"must be one of {', '.join(_MASK_TYPES)}, "
                             f"got {mask_type!r}")
    if causal and mask_type not in _CAUSAL:
        raise errors.invalid("causal", f"is True but mask_type is {mask_type!r}")
    return mask_type


def _window(window_size):
    try:
        left, right = window_size
    except (TypeError, ValueError):
        raise errors.invalid("window_size", f"must be a pair (left, right), got {window_size!r}")
    for bound in (left, right):
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < -1:
            raise errors.invalid("window_size", "must be a pair of integers >= -1 (-1 is "
                                 f"unbounded), got {window_size!r}")
    return left, right


# The library's ranges (core/problem_builder.cc), checked here so that errors name the Python
# argument (softmax_scale, not scale).
_MIN_MAGNITUDE, _MAX_MAGNITUDE = 1e-30, 1e30


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise errors.invalid(name, f"must be a number, got {value!r}")
    return float(value)


def _softcap(softcap):
    cap = _number(softcap, "softcap")
    if not (cap == 0.0 or _MIN_MAGNITUDE <= cap <= _MAX_MAGNITUDE):
        raise errors.invalid("softcap", f"must be 0 or within [{_MIN_MAGNITUDE:g}, "
                             f"{_MAX_MAGNITUDE:g}], got {softcap!r}")
    return cap


def _scale(softmax_scale):
    if softmax_scale is None:
        return None
    scale = _number(softmax_scale, "softmax_scale")
    if not _MIN_MAGNITUDE <= scale <= _MAX_MAGNITUDE:
        raise errors.invalid("softmax_scale", f"must be within [{_MIN_MAGNITUDE:g}, "
                             f"{_MAX_MAGNITUDE:g}], got {softmax_scale!r}")
    return scale


def _dropout(dropout_p):
    p = _number(dropout_p, "dropout_p")
    if not 0.0 <= p < 1.0:
        raise errors.invalid("dropout_p", f"must be in [0, 1), got {dropout_p!r}")
    return p


# The library's aliases (core/types.cc parse_*), mapped to the names every Python path matches.
_SOFTMAX_ALIASES = {"off_by_one": "off-by-one"}
_BIAS_ALIASES = {"pre_scale_bias": "pre_scale", "post_scale_bias": "post_scale", "none": "no_bias"}


def _softmax_type(softmax_type, sinks):
    softmax_type = _SOFTMAX_ALIASES.get(softmax_type, softmax_type)
    if softmax_type is None:
        return "learnable" if sinks is not None else "vanilla"
    if softmax_type == "learnable" and sinks is None:
        raise errors.invalid("sinks", "is required with softmax_type 'learnable'")
    if softmax_type != "learnable" and sinks is not None:
        raise errors.invalid("sinks", f"is given but softmax_type is {softmax_type!r}")
    return softmax_type


def _bias_type(bias_type, bias):
    bias_type = _BIAS_ALIASES.get(bias_type, bias_type)
    if bias is None:
        if bias_type not in (None, "no_bias"):
            raise errors.invalid("bias", f"is required with bias_type {bias_type!r}")
        return "no_bias"
    if bias_type is None:
        return "post_scale"
    if bias_type == "no_bias":
        raise errors.invalid("bias", "is given but bias_type is 'no_bias'")
    return bias_type


def _dropout_rng(dropout_p, generator, seed, offset):
    """(seed, offset) as an int64 [2] host tensor, or None without dropout. A fresh seed is
    drawn from ``generator`` (the default CPU generator when None) unless ``seed`` is given;
    the draw is on the host, so no device synchronises."""
    if offset is not None and seed is None:
        raise errors.invalid("offset", "is given without seed (a drawn seed takes offset 0)")
    for value, name in ((seed, "seed"), (offset, "offset")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < 2**63):
            raise errors.invalid(name, f"must be an integer in [0, 2^63), got {value!r}")
    if dropout_p == 0.0:
        return None
    if seed is not None:
        return torch.tensor([seed, offset or 0], dtype=torch.int64)
    if (not torch.compiler.is_compiling() and torch.cuda.is_available()
            and torch.cuda.is_current_stream_capturing()):
        # The seed drawn here would be the graph's: every replay would drop the same elements.
        raise errors.invalid("dropout_p", "is drawn a fresh seed on the host per call, and a "
                             "CUDA graph being captured would replay this call's seed at every "
                             "launch: pass seed= (and offset=) to fix the mask on purpose, or "
                             "capture without dropout", errors.NotSupportedError)
    drawn = torch.randint(0, 2**62, (1,), dtype=torch.int64, generator=generator)
    return torch.cat([drawn, torch.zeros(1, dtype=torch.int64)])


def resolve(*, qkv_format, causal, mask_type, window_size, bottom_right_diagonal, softcap,
            softmax_scale, softmax_type, sinks, bias, bias_type, dropout_p, layer_number,
            deterministic, backend, padded) -> Resolved:
    mask = _mask_type(causal, mask_type, padded)
    if bottom_right_diagonal is None:
        bottom_right_diagonal = True
    left, right = _window(window_size)
    return Resolved(
        qkv_format=qkv_format,
        mask_type=mask,
        window_left=left,
        window_right=right,
        bottom_right_diagonal=bool(bottom_right_diagonal),
        softcap=_softcap(softcap),
        softmax_scale=_scale(softmax_scale),
        softmax_type=_softmax_type(softmax_type, sinks),
        bias_type=_bias_type(bias_type, bias),
        dropout_p=_dropout(dropout_p),
        layer_number=int(layer_number or 0),
        deterministic=bool(deterministic),
        backend=backend or "auto",
    )


def _run(q, k, v, config: Resolved, *, cu_seqlens_q=None, cu_seqlens_kv=None,
         cu_seqlens_q_padded=None, cu_seqlens_kv_padded=None, bias=None, alibi_slopes=None,
         sinks=None, attn_mask=None, generator=None, seed=None, offset=None, return_lse=False):
    _require_tensors(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                     cu_seqlens_q_padded=cu_seqlens_q_padded,
                     cu_seqlens_kv_padded=cu_seqlens_kv_padded, bias=bias,
                     alibi_slopes=alibi_slopes, sinks=sinks, attn_mask=attn_mask)
    _check_sinks(sinks, q)
    if alibi_slopes is not None and alibi_slopes.requires_grad:
        raise errors.invalid("alibi_slopes", "requires grad, but dpa computes no gradient for "
                             "the slopes (detach them)", errors.NotSupportedError)
    if export_graph.exporting():
        # ONNX export: standard operators instead of the custom op (dpa/export_graph.py).
        if return_lse:
            raise errors.invalid("return_lse", "is True while exporting to ONNX (the graph "
                                 "computes o only)", errors.NotSupportedError)
        return export_graph.attention_graph(
            q, k, v, config, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
            cu_seqlens_q_padded=cu_seqlens_q_padded, cu_seqlens_kv_padded=cu_seqlens_kv_padded,
            bias=bias, alibi_slopes=alibi_slopes, sinks=sinks, attn_mask=attn_mask)
    rng = _dropout_rng(config.dropout_p, generator, seed, offset)
    inputs = (q, k, v, cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded,
              bias, alibi_slopes, sinks, attn_mask, rng, *config)
    # Traced (torch.compile, export): the custom op, which the graph keeps. Eager: the same
    # functions without the dispatcher; without autograd, without the graph node too.
    if torch.compiler.is_compiling():
        o, lse = ops.forward(*inputs)
    elif torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (q, k, v, bias, sinks)):
        o, lse = ops.EagerAttention.apply(*inputs)
    else:
        o, lse = ops.forward_impl(*inputs)
    return (o, lse) if return_lse else o


def _check_sinks(sinks, q):
    """Here rather than in the library, so that the error names ``sinks`` (the library's
    ``softmax_offset``)."""
    if sinks is not None and (sinks.dtype != torch.float32 or sinks.dim() != 1
                              or sinks.shape[0] != q.shape[-2] or sinks.stride(0) != 1):
        raise errors.invalid("sinks", f"must be a contiguous fp32 [H] = [{q.shape[-2]}] tensor, "
                             f"got {sinks.dtype} {list(sinks.shape)}")


def _require_tensors(**named):
    """The dispatcher would reject other objects with a message naming no argument."""
    for name, value in named.items():
        if value is not None and not isinstance(value, torch.Tensor):
            raise errors.invalid(name, f"must be a torch.Tensor, got {type(value).__name__} "
                                 "(arrays of other frameworks: torch.from_dlpack)",
                                 errors.DTypeError)


def attention(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    *,
    qkv_format="bshd",
    mask_type=None,
    bottom_right_diagonal=None,
    sinks=None,
    softmax_type=None,
    bias=None,
    bias_type=None,
    attn_mask=None,
    cu_seqlens_q=None,
    cu_seqlens_kv=None,
    generator=None,
    seed=None,
    offset=None,
    layer_number=None,
    backend=None,
):
    """Dot-product attention over q [b, sq, H, dqk], k [b, skv, G, dqk], v [b, skv, G, dv]
    (``qkv_format="sbhd"``: s first). Returns o like q with dv, and with ``return_lse`` also
    lse, fp32 [b, H, sq] (natural log, sink included; not differentiable).

    Every feature of DESIGN.md §3-5: ``causal`` (bottom-right aligned, as in FlashAttention) or
    ``mask_type``; ``window_size=(left, right)`` (-1 unbounded); ``softcap`` (c * tanh(x / c));
    ``sinks`` (fp32 [H], the learnable sink logit, differentiable) or
    ``softmax_type="off-by-one"``; ``alibi_slopes`` (fp32 [H] or [b, H]); ``bias``
    [b|1, H|1, sq|1, skv] with ``bias_type`` ``"post_scale"`` (default) or ``"pre_scale"``,
    differentiable; ``attn_mask`` (bool, True = masked, with ``mask_type="arbitrary"``);
    ``cu_seqlens_q/kv`` (int32 [b + 1]) give per-sequence lengths for padding masks;
    ``dropout_p`` with a ``generator`` or an explicit ``seed`` / ``offset``;
    ``deterministic``; ``backend`` forces one (``"cpu"``, ``"cpu_exact"``, ``"cuda_flash"``,
    ``"cuda_unfused"``). Gradients flow to q, k, v, sinks and bias.
    """
    if qkv_format not in ("bshd", "sbhd"):
        raise errors.invalid("qkv_format", f"must be 'bshd' or 'sbhd' here (use "
                             f"attention_varlen for thd), got {qkv_format!r}")
    config = resolve(qkv_format=qkv_format, causal=causal, mask_type=mask_type,
                     window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
                     softcap=softcap, softmax_scale=softmax_scale, softmax_type=softmax_type,
                     sinks=sinks, bias=bias, bias_type=bias_type, dropout_p=dropout_p,
                     layer_number=layer_number, deterministic=deterministic, backend=backend,
                     padded=cu_seqlens_q is not None or cu_seqlens_kv is not None)
    return _run(q, k, v, config, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_kv,
                bias=bias, alibi_slopes=alibi_slopes, sinks=sinks, attn_mask=attn_mask,
                generator=generator, seed=seed, offset=offset, return_lse=return_lse)


def attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q=None,
    max_seqlen_k=None,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_lse=False,
    *,
    cu_seqlens_q_padded=None,
    cu_seqlens_k_padded=None,
    mask_type=None,
    bottom_right_diagonal=None,
    sinks=None,
    softmax_type=None,
    bias=None,
    bias_type=None,
    attn_mask=None,
    generator=None,
    seed=None,
    offset=None,
    layer_number=None,
    backend=None,
):
    """Attention over packed sequences (thd): q [tq, H, dqk], k [tkv, G, dqk], v [tkv, G, dv];
    sequence i is rows cu_seqlens_q[i] .. cu_seqlens_q[i + 1] (int32 [b + 1]), or starts at
    ``cu_seqlens_q_padded[i]`` when sequences are stored with gaps. lse is fp32 [H, tq].

    ``max_seqlen_q`` / ``max_seqlen_k`` are accepted for FlashAttention compatibility; dpa
    reads the lengths from cu_seqlens and checks the given maxima against them when the
    tables are host tensors. Device-resident tables are copied to the host once per call to
    be validated (a synchronisation: pass host tensors to avoid it). Other arguments as in
    ``attention``.
    """
    _check_max_seqlen(cu_seqlens_q, max_seqlen_q, "max_seqlen_q")
    _check_max_seqlen(cu_seqlens_k, max_seqlen_k, "max_seqlen_k")
    config = resolve(qkv_format="thd", causal=causal, mask_type=mask_type,
                     window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
                     softcap=softcap, softmax_scale=softmax_scale, softmax_type=softmax_type,
                     sinks=sinks, bias=bias, bias_type=bias_type, dropout_p=dropout_p,
                     layer_number=layer_number, deterministic=deterministic, backend=backend,
                     padded=True)
    return _run(q, k, v, config, cu_seqlens_q=cu_seqlens_q, cu_seqlens_kv=cu_seqlens_k,
                cu_seqlens_q_padded=cu_seqlens_q_padded,
                cu_seqlens_kv_padded=cu_seqlens_k_padded, bias=bias, alibi_slopes=alibi_slopes,
                sinks=sinks, attn_mask=attn_mask, generator=generator, seed=seed, offset=offset,
                return_lse=return_lse)


def _check_max_seqlen(cu_seqlens, max_seqlen, name):
    if max_seqlen is None or not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.is_cuda:
        return
    if cu_seqlens.numel() >= 2:
        longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
        if longest > max_seqlen:
            raise errors.invalid(name, f"is {max_seqlen}, but a sequence has {longest} rows")


class Verdict(NamedTuple):
    backend: str
    eligible: bool
    reasons: Tuple[str, ...]
    plan: str = ""  # eligible: what it would run (cuda_flash: the kernel family and tiles)


class Explanation(NamedTuple):
    """What a call would run: the chosen backend (None when nothing is eligible), whether it
    was forced, and every backend's verdict with its reasons."""

    chosen: Optional[str]
    forced: bool
    verdicts: Tuple[Verdict, ...]

    def __str__(self):
        lines = [f"selected: {self.chosen or 'none'}" + (" (forced)" if self.forced else "")]
        for verdict in self.verdicts:
            lines.append(f"  {verdict.backend}: "
                         f"{'eligible' if verdict.eligible else 'rejected'}")
            if verdict.plan:
                lines.append(f"    runs: {verdict.plan}")
            lines.extend(f"    - {reason}" for reason in verdict.reasons)
        return "\n".join(lines)


def explain(q, k, v, *, backward=False, qkv_format="bshd", causal=False, mask_type=None,
            window_size=(-1, -1), bottom_right_diagonal=None, softcap=0.0, softmax_scale=None,
            sinks=None, softmax_type=None, bias=None, bias_type=None, alibi_slopes=None,
            attn_mask=None, cu_seqlens_q=None, cu_seqlens_kv=None, cu_seqlens_q_padded=None,
            cu_seqlens_kv_padded=None, dropout_p=0.0, deterministic=False, layer_number=None,
            backend=None) -> Explanation:
    """The selection that ``attention`` (or its backward, with ``backward=True``) would make
    for these tensors, with every backend's reasons. Tensor contents are not read. Gradients
    of bias and sinks count as requested when those tensors require grad."""
    config = resolve(qkv_format=qkv_format, causal=causal, mask_type=mask_type,
                     window_size=window_size, bottom_right_diagonal=bottom_right_diagonal,
                     softcap=softcap, softmax_scale=softmax_scale, softmax_type=softmax_type,
                     sinks=sinks, bias=bias, bias_type=bias_type, dropout_p=dropout_p,
                     layer_number=layer_number, deterministic=deterministic, backend=backend,
                     padded=qkv_format == "thd" or cu_seqlens_q is not None
                     or cu_seqlens_kv is not None)
    chosen, forced, verdicts = ops._attention(config).explain(
        view(q, "q"), view(k, "k"), view(v, "v"), view(cu_seqlens_q, "cu_seqlens_q"),
        view(cu_seqlens_kv, "cu_seqlens_kv"), view(cu_seqlens_q_padded, "cu_seqlens_q_padded"),
        view(cu_seqlens_kv_padded, "cu_seqlens_kv_padded"), view(bias, "bias"),
        view(alibi_slopes, "alibi_slopes"), view(sinks, "sinks"), view(attn_mask, "attn_mask"),
        backward, bias is not None and bias.requires_grad,
        sinks is not None and sinks.requires_grad)
    return Explanation(chosen, forced,
                       tuple(Verdict(name, ok, tuple(reasons), plan)
                             for name, ok, reasons, plan in verdicts))


__all__ = ["attention", "attention_varlen", "explain", "Explanation", "Verdict"]
