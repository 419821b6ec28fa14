"""dpa as a Hugging Face ``transformers`` attention backend.

    import dpa.integrations.transformers as dpa_hf
    dpa_hf.register()
    model = AutoModelForCausalLM.from_config(config, attn_implementation="dpa")

``register()`` adds ``"dpa"`` to ``AttentionInterface`` (``attention_forward`` below) and to
``AttentionMaskInterface`` with FlashAttention's mask function: the model then hands the
attention a 2-D padding mask [b, kv_len] (or None), and the causal mask, the sliding window,
the soft-cap and the sinks as the models' own arguments, which dpa applies in its kernels.

Every argument that Gemma 2, gpt-oss and Llama-family models pass is honoured: q / k / v in
[b, h, s, d] with unexpanded KV heads (GQA), ``scaling``, ``softcap``, ``sliding_window``,
``s_aux`` (the sinks), ``dropout``, ``is_causal``, padding (left or right, one contiguous run
of tokens per sequence) and packed sequences (``cu_seq_lens_q`` / ``cu_seq_lens_k``). An
argument it cannot honour raises: HF's SDPA path drops ``softcap`` and ``s_aux`` silently;
this one never drops anything.
"""

from typing import Optional

import torch

from .. import errors
from ..functional import attention, attention_varlen

# Arguments the models pass that do not change attention's result here (cache bookkeeping,
# outputs of other layers, positions already applied by the rotary embedding).
_IGNORED = frozenset({"position_ids", "cache_position", "use_cache", "output_hidden_states",
                      "output_router_logits", "num_items_in_batch", "return_dict",
                      "max_length_q", "max_length_k", "layer_idx", "cache", "past_key_values",
                      "token_type_ids"})


def _check_kwargs(kwargs):
    for name, value in kwargs.items():
        if name in _IGNORED or value is None:
            continue
        if name == "output_attentions" and not value:
            continue
        if name == "output_attentions":
            raise errors.invalid("output_attentions", "is True, but dpa never forms the "
                                 "attention weights (use attn_implementation='eager' to "
                                 "inspect them)", errors.NotSupportedError)
        raise errors.invalid(name, "is not an argument the dpa attention backend can honour",
                             errors.NotSupportedError)


def _runs(mask: torch.Tensor):
    """Start and length of each row's run of True values; raises unless each row has one
    contiguous run (left or right padding)."""
    length = mask.sum(dim=1)
    start = torch.where(length > 0, mask.int().argmax(dim=1), torch.zeros_like(length))
    positions = torch.arange(mask.shape[1], device=mask.device).view(1, -1)
    inside = (positions >= start.view(-1, 1)) & (positions < (start + length).view(-1, 1))
    if not torch.equal(inside, mask):
        raise errors.invalid("attention_mask", "has a padding pattern with gaps inside a "
                             "sequence; dpa takes left or right padding (one run of tokens per "
                             "row)", errors.NotSupportedError)
    return start, length


def _padded_tables(attention_mask, batch, sq, skv):
    """thd tables for a padded batch: lengths and row offsets of queries and keys in the
    flattened [b * s] tensors. The queries are the last sq positions of the key axis (HF's
    caches), and each sequence's queries must end where its keys end (so that causal
    alignment is per sequence)."""
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, skv):
        raise errors.invalid("attention_mask", f"must be the 2-D padding mask [{batch}, {skv}] "
                             "that dpa's mask function builds, got "
                             f"{list(attention_mask.shape)} (register() installs it)",
                             errors.NotSupportedError)
    mask = attention_mask.to(device="cpu", dtype=torch.bool)
    kv_start, kv_len = _runs(mask)
    q_start, q_len = _runs(mask[:, skv - sq:])
    misaligned = (q_len > 0) & (q_start + q_len + (skv - sq) != kv_start + kv_len)
    if bool(misaligned.any()):
        raise errors.invalid("attention_mask", "puts queries after the end of their "
                             "sequence's keys", errors.NotSupportedError)

    def tables(start, length, rows):
        cu = torch.zeros(batch + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(length, 0)
        offsets = torch.empty(batch + 1, dtype=torch.int32)
        offsets[:-1] = torch.arange(batch, dtype=torch.int32) * rows + start.int()
        offsets[-1] = batch * rows
        return cu, offsets

    return tables(q_start, q_len, sq), tables(kv_start, kv_len, skv)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      softcap=None, sliding_window=None, s_aux=None, is_causal=None,
                      cu_seq_lens_q=None, cu_seq_lens_k=None, **kwargs):
    """The ``AttentionInterface`` function: query [b, H, sq, d], key / value [b, G, skv, d];
    returns (output [b, sq, H, dv], None)."""
    _check_kwargs(kwargs)
    batch, _, sq, _ = query.shape
    skv = key.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # HF's sliding window W keeps the W most recent keys, the query's own included.
    if sliding_window:
        window = (int(sliding_window) - 1, 0 if causal else int(sliding_window) - 1)
    else:
        window = (-1, -1)
    options = dict(
        dropout_p=float(dropout) if module.training else 0.0,
        softmax_scale=scaling, causal=bool(causal), window_size=window,
        softcap=float(softcap) if softcap else 0.0,
        # dpa's sinks are an fp32 [H] tensor; the cast keeps the gradient path to s_aux.
        sinks=None if s_aux is None else s_aux.float().contiguous())
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # bshd views
    if cu_seq_lens_q is not None or cu_seq_lens_k is not None:
        if batch != 1 or cu_seq_lens_q is None or cu_seq_lens_k is None:
            raise errors.invalid("cu_seq_lens_q", "and cu_seq_lens_k describe one packed row "
                                 "(batch 1), and come together", errors.NotSupportedError)
        o = attention_varlen(q[0], k[0], v[0], cu_seq_lens_q.to(torch.int32),
                             cu_seq_lens_k.to(torch.int32), **options)
        return o.unsqueeze(0), None
    if attention_mask is None or bool(attention_mask.all()):
        return attention(q, k, v, **options), None
    (cu_q, start_q), (cu_kv, start_kv) = _padded_tables(attention_mask, batch, sq, skv)
    H, G = q.shape[2], k.shape[2]
    o = attention_varlen(q.reshape(batch * sq, H, -1), k.reshape(batch * skv, G, -1),
                         v.reshape(batch * skv, G, -1), cu_q, cu_kv,
                         cu_seqlens_q_padded=start_q, cu_seqlens_k_padded=start_kv, **options)
    return o.view(batch, sq, H, -1), None


def register(name: str = "dpa") -> str:
    """Registers dpa under ``name`` with transformers' attention and mask interfaces, and
    returns the name to pass as ``attn_implementation``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


__all__ = ["attention_forward", "register"]
