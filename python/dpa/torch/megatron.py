"""``dpa.torch.attention_from_config``: a Megatron-style config onto DotProductAttention.

Reads the attention fields of Megatron-LM's ``TransformerConfig`` (or any object with the same
attribute names): ``num_attention_heads``, ``num_query_groups``, ``kv_channels``,
``hidden_size``, ``attention_dropout``, ``softmax_type``, ``window_size`` with
``window_attn_skip_freq`` (which layers keep the window), ``attn_logit_softcapping``,
``softmax_scale`` and ``apply_query_key_layer_scaling``. Missing optional fields take
Megatron's defaults.

The cap follows Megatron-LM's rule: None is off, and a cap of 0 or below is an error at config
time, because 0 means "off" in dpa's kernels but would collapse every logit to zero on a naive
``c * tanh(x / c)`` path; an explicit value must be a real cap.
"""

from typing import Optional

from .. import errors
from .dot_product_attention import DotProductAttention


def _field(cfg, name, default=None):
    value = getattr(cfg, name, default)
    return default if value is None else value


def layer_has_window(window_size, window_attn_skip_freq, layer_number: int) -> bool:
    """Megatron's rule (1-based layer numbers): every layer when the skip frequency is None,
    layers whose number is not a multiple of an int frequency, or the layers a 0/1 list marks."""
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    if isinstance(window_attn_skip_freq, bool):
        raise errors.invalid("window_attn_skip_freq", "must be an int or a list, got a bool")
    if isinstance(window_attn_skip_freq, int):
        if window_attn_skip_freq <= 0:
            raise errors.invalid("window_attn_skip_freq", f"must be > 0, got "
                                 f"{window_attn_skip_freq}")
        return layer_number % window_attn_skip_freq != 0
    if isinstance(window_attn_skip_freq, (list, tuple)):
        if not 1 <= layer_number <= len(window_attn_skip_freq):
            raise errors.invalid("window_attn_skip_freq", f"has {len(window_attn_skip_freq)} "
                                 f"entries, no entry for layer {layer_number}")
        return bool(window_attn_skip_freq[layer_number - 1])
    raise errors.invalid("window_attn_skip_freq", f"must be an int or a list, got "
                         f"{type(window_attn_skip_freq).__name__}")


def softcap_from_config(cfg) -> float:
    """The config's cap as dpa takes it (0: off); a cap of 0 or below is an error."""
    cap = getattr(cfg, "attn_logit_softcapping", None)
    if cap is None:
        return 0.0
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise errors.invalid("attn_logit_softcapping", f"must be None (off) or > 0, got {cap!r} "
                             "(0 would zero every logit on a path that applies it literally)")
    return float(cap)


def attention_from_config(cfg, layer_number: int = 1, *, attn_mask_type: str = "causal",
                          qkv_format: str = "sbhd", backend: Optional[str] = None,
                          deterministic: Optional[bool] = None) -> DotProductAttention:
    """A DotProductAttention for layer ``layer_number`` (1-based) of the model ``cfg``
    describes."""
    if isinstance(layer_number, bool) or not isinstance(layer_number, int) or layer_number < 1:
        raise errors.invalid("layer_number", f"must be an integer >= 1, got {layer_number!r}")
    heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(heads, int) or heads <= 0:
        raise errors.invalid("num_attention_heads", f"must be a positive int, got {heads!r}")
    kv_channels = _field(cfg, "kv_channels")
    if kv_channels is None:
        hidden = getattr(cfg, "hidden_size", None)
        if not isinstance(hidden, int) or hidden % heads:
            raise errors.invalid("kv_channels", "is missing and hidden_size "
                                 f"{hidden!r} is not a multiple of num_attention_heads {heads}")
        kv_channels = hidden // heads
    window = _field(cfg, "window_size")
    if not layer_has_window(window, getattr(cfg, "window_attn_skip_freq", None), layer_number):
        window = None
    scaling = bool(_field(cfg, "apply_query_key_layer_scaling", False))
    return DotProductAttention(
        heads, kv_channels, num_gqa_groups=_field(cfg, "num_query_groups", heads),
        attention_dropout=float(_field(cfg, "attention_dropout", 0.0)), qkv_format=qkv_format,
        attn_mask_type=attn_mask_type, window_size=tuple(window) if window else None,
        softmax_type=_field(cfg, "softmax_type", "vanilla"), softcap=softcap_from_config(cfg),
        layer_number=layer_number if scaling else None,
        softmax_scale=_field(cfg, "softmax_scale"),
        deterministic=bool(_field(cfg, "deterministic_mode", False)
                           if deterministic is None else deterministic),
        backend=backend)
