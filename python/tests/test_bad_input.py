"""The Python bad-input corpus (issue 15): each case is one call that must raise a dpa.Error
subclass naming the argument, and write nothing into outputs the caller passed (dpa.direct's
out= / lse=, filled with a sentinel first)."""

import math

import numpy as np
import pytest
import torch

import dpa
import dpa.direct
from dpa.torch import DotProductAttention

B, S, H, G, D = 2, 6, 4, 2, 8


def tensors():
    torch.manual_seed(0)
    return {
        "q": torch.randn(B, S, H, D),
        "k": torch.randn(B, S, G, D),
        "v": torch.randn(B, S, G, D),
        "sinks": torch.randn(H),
        "bias": torch.randn(1, H, S, S),
        "alibi": torch.rand(H),
        "mask": torch.zeros(B, 1, S, S, dtype=torch.bool),
        "cu": torch.tensor([0, 4, 10], dtype=torch.int32),
        "thd": torch.randn(10, H, D),
        "thd_kv": torch.randn(10, G, D),
    }


def noncontiguous_head_dim(t):
    return t.transpose(-1, -2).contiguous().transpose(-1, -2)


# (name, exception class, argument named, call(t) -> None)
CASES = [
    # dtypes and types
    ("q_int64", dpa.DTypeError, "q", lambda t: dpa.attention(t["q"].long(), t["k"], t["v"])),
    ("q_complex", dpa.DTypeError, "q",
     lambda t: dpa.attention(t["q"].to(torch.complex64), t["k"], t["v"])),
    ("k_other_dtype", dpa.InvalidArgumentError, "k",
     lambda t: dpa.attention(t["q"], t["k"].double(), t["v"])),
    ("v_other_dtype", dpa.InvalidArgumentError, "v",
     lambda t: dpa.attention(t["q"], t["k"], t["v"].half())),
    ("q_numpy", dpa.DTypeError, "q", lambda t: dpa.attention(t["q"].numpy(), t["k"], t["v"])),
    ("k_list", dpa.DTypeError, "k", lambda t: dpa.attention(t["q"], [1.0], t["v"])),
    ("v_none", dpa.DTypeError, "v", lambda t: dpa.attention(t["q"], t["k"], 3.0)),
    ("sinks_float64", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=t["sinks"].double())),
    ("sinks_numpy", dpa.DTypeError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=t["sinks"].numpy())),
    ("alibi_float64", dpa.InvalidArgumentError, "alibi_slopes",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], alibi_slopes=t["alibi"].double())),
    ("mask_float", dpa.InvalidArgumentError, "attn_mask",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], mask_type="arbitrary",
                             attn_mask=t["mask"].float())),
    ("cu_int64", dpa.InvalidArgumentError, "cu_seqlens_q",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"], t["cu"].long(),
                                    t["cu"])),
    ("bias_int", dpa.DTypeError, "bias",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias=t["bias"].long())),
    # shapes
    ("q_3d", dpa.InvalidArgumentError, "q", lambda t: dpa.attention(t["q"][0], t["k"], t["v"])),
    ("k_head_dim", dpa.InvalidArgumentError, "k",
     lambda t: dpa.attention(t["q"], t["k"][..., :4], t["v"])),
    ("v_seq", dpa.InvalidArgumentError, "v",
     lambda t: dpa.attention(t["q"], t["k"], t["v"][:, :3])),
    ("k_batch", dpa.InvalidArgumentError, "k",
     lambda t: dpa.attention(t["q"], t["k"][:1], t["v"][:1])),
    ("heads_not_divisible", dpa.InvalidArgumentError, "k",
     lambda t: dpa.attention(t["q"], torch.randn(B, S, 3, D), torch.randn(B, S, 3, D))),
    ("sinks_wrong_length", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=torch.zeros(3))),
    ("sinks_2d", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=torch.zeros(1, H))),
    ("alibi_wrong_length", dpa.InvalidArgumentError, "alibi_slopes",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], alibi_slopes=torch.rand(H + 1))),
    ("bias_wrong_kv", dpa.InvalidArgumentError, "bias",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias=torch.randn(1, H, S, S + 1))),
    ("bias_3d", dpa.InvalidArgumentError, "bias",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias=torch.randn(H, S, S))),
    ("mask_wrong_shape", dpa.InvalidArgumentError, "attn_mask",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], mask_type="arbitrary",
                             attn_mask=torch.zeros(B, 1, S, S + 2, dtype=torch.bool))),
    ("cu_wrong_length", dpa.InvalidArgumentError, "cu_seqlens_q",
     lambda t: dpa.attention(t["q"], t["k"], t["v"],
                             cu_seqlens_q=torch.tensor([0, 3], dtype=torch.int32))),
    ("cu_not_monotone", dpa.InvalidArgumentError, "cu_seqlens_q",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"],
                                    torch.tensor([0, 6, 4], dtype=torch.int32), t["cu"])),
    ("cu_beyond_rows", dpa.InvalidArgumentError, "k",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"], t["cu"],
                                    torch.tensor([0, 4, 12], dtype=torch.int32))),
    ("cu_not_from_zero", dpa.InvalidArgumentError, "cu_seqlens_q",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"],
                                    torch.tensor([1, 4, 10], dtype=torch.int32), t["cu"])),
    ("max_seqlen_too_small", dpa.InvalidArgumentError, "max_seqlen_q",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"], t["cu"], t["cu"], 2, 6)),
    # strides
    ("q_head_dim_not_contiguous", dpa.InvalidArgumentError, "q",
     lambda t: dpa.attention(noncontiguous_head_dim(t["q"]), t["k"], t["v"])),
    ("v_head_dim_not_contiguous", dpa.InvalidArgumentError, "v",
     lambda t: dpa.attention(t["q"], t["k"], noncontiguous_head_dim(t["v"]))),
    ("sinks_strided", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=torch.randn(2 * H)[::2])),
    # values
    ("negative_softcap", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap=-1.0)),
    ("nan_softcap", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap=math.nan)),
    ("inf_softcap", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap=math.inf)),
    ("softcap_below_fp32", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap=1e-46)),
    ("softcap_above_fp32", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap=1e39)),
    ("zero_scale", dpa.InvalidArgumentError, "softmax_scale",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softmax_scale=0.0)),
    ("huge_scale", dpa.InvalidArgumentError, "softmax_scale",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softmax_scale=1e39)),
    ("dropout_one", dpa.InvalidArgumentError, "dropout_p",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], dropout_p=1.0)),
    ("dropout_negative", dpa.InvalidArgumentError, "dropout_p",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], dropout_p=-0.1)),
    ("nan_sink", dpa.InvalidArgumentError, "softmax_offset",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=torch.tensor([0., math.nan, 0., 0.]))),
    ("inf_sink", dpa.InvalidArgumentError, "softmax_offset",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=torch.tensor([0., math.inf, 0., 0.]))),
    ("nan_alibi", dpa.InvalidArgumentError, "alibi_slopes",
     lambda t: dpa.attention(t["q"], t["k"], t["v"],
                             alibi_slopes=torch.tensor([0.1, math.nan, 0.1, 0.1]))),
    ("window_below_minus_one", dpa.InvalidArgumentError, "window_size",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], window_size=(-2, 0))),
    ("window_right_with_causal", dpa.InvalidArgumentError, "window_right",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], mask_type="causal", window_size=(4, 2))),
    ("window_not_a_pair", dpa.InvalidArgumentError, "window_size",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], window_size=4)),
    # names and combinations
    ("unknown_mask", dpa.InvalidArgumentError, "mask_type",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], mask_type="diagonal")),
    ("causal_with_no_mask", dpa.InvalidArgumentError, "causal",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], causal=True, mask_type="no_mask")),
    ("unknown_format", dpa.InvalidArgumentError, "qkv_format",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], qkv_format="bhsd")),
    ("unknown_softmax_type", dpa.InvalidArgumentError, "softmax_type",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softmax_type="two-by-two")),
    ("unknown_bias_type", dpa.InvalidArgumentError, "bias_type",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias=t["bias"], bias_type="middle")),
    ("unknown_backend", dpa.InvalidArgumentError, "backend",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], backend="gpu")),
    ("learnable_without_sinks", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softmax_type="learnable")),
    ("sinks_with_off_by_one", dpa.InvalidArgumentError, "sinks",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], sinks=t["sinks"],
                             softmax_type="off-by-one")),
    ("bias_type_without_bias", dpa.InvalidArgumentError, "bias",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias_type="pre_scale")),
    ("no_bias_with_bias", dpa.InvalidArgumentError, "bias",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], bias=t["bias"], bias_type="no_bias")),
    ("mask_without_arbitrary", dpa.InvalidArgumentError, "attn_mask",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], attn_mask=t["mask"])),
    ("arbitrary_without_mask", dpa.InvalidArgumentError, "attn_mask",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], mask_type="arbitrary")),
    ("forced_cuda_on_host", dpa.NotSupportedError, "backend",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], backend="cuda_flash")),
    ("thd_through_attention", dpa.InvalidArgumentError, "qkv_format",
     lambda t: dpa.attention(t["thd"], t["thd_kv"], t["thd_kv"], qkv_format="thd")),
    ("padded_offsets_beyond_rows", dpa.InvalidArgumentError, "cu_seqlens_q_padded",
     lambda t: dpa.attention_varlen(t["thd"], t["thd_kv"], t["thd_kv"], t["cu"], t["cu"],
                                    cu_seqlens_q_padded=torch.tensor([0, 5, 11],
                                                                     dtype=torch.int32))),
    # the TE-style layer
    ("layer_zero_heads", dpa.InvalidArgumentError, "num_attention_heads",
     lambda t: DotProductAttention(0, D)),
    ("layer_groups_not_dividing", dpa.InvalidArgumentError, "num_gqa_groups",
     lambda t: DotProductAttention(H, D, num_gqa_groups=3)),
    ("layer_unknown_mask", dpa.InvalidArgumentError, "mask_type",
     lambda t: DotProductAttention(H, D, attn_mask_type="diagonal")),
    ("layer_unknown_bias_type", dpa.InvalidArgumentError, "core_attention_bias_type",
     lambda t: DotProductAttention(H, D, num_gqa_groups=G, qkv_format="bshd")(
         t["q"], t["k"], t["v"], core_attention_bias_type="middle")),
    ("layer_alibi_with_bias", dpa.InvalidArgumentError, "core_attention_bias",
     lambda t: DotProductAttention(H, D, num_gqa_groups=G, qkv_format="bshd")(
         t["q"], t["k"], t["v"], core_attention_bias_type="alibi",
         core_attention_bias=t["bias"])),
    ("layer_slopes_without_alibi", dpa.InvalidArgumentError, "alibi_slopes",
     lambda t: DotProductAttention(H, D, num_gqa_groups=G, qkv_format="bshd")(t["q"], t["k"], t["v"],
                                                            alibi_slopes=t["alibi"])),
    ("layer_mask_without_arbitrary", dpa.InvalidArgumentError, "attention_mask",
     lambda t: DotProductAttention(H, D, num_gqa_groups=G, qkv_format="bshd")(t["q"], t["k"], t["v"],
                                                            attention_mask=t["mask"])),
    ("layer_max_seqlen_disagrees", dpa.InvalidArgumentError, "max_seqlen_q",
     lambda t: DotProductAttention(H, D, num_gqa_groups=G, qkv_format="bshd")(t["q"], t["k"], t["v"],
                                                            max_seqlen_q=S + 1)),
    ("softcap_not_a_number", dpa.InvalidArgumentError, "softcap",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], softcap="big")),
    ("float_window", dpa.InvalidArgumentError, "window_size",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], window_size=(3.7, 0))),
    ("offset_without_seed", dpa.InvalidArgumentError, "offset",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], dropout_p=0.1, offset=3)),
    ("seed_beyond_int64", dpa.InvalidArgumentError, "seed",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], dropout_p=0.1, seed=2**64)),
    ("negative_seed", dpa.InvalidArgumentError, "seed",
     lambda t: dpa.attention(t["q"], t["k"], t["v"], dropout_p=0.1, seed=-1)),
    ("alibi_requires_grad", dpa.NotSupportedError, "alibi_slopes",
     lambda t: dpa.attention(t["q"], t["k"], t["v"],
                             alibi_slopes=t["alibi"].requires_grad_())),
    ("layer_heads_disagree", dpa.InvalidArgumentError, "query_layer",
     lambda t: DotProductAttention(2, D, qkv_format="bshd")(t["q"], t["k"], t["v"])),
    ("layer_head_dim_disagrees", dpa.InvalidArgumentError, "query_layer",
     lambda t: DotProductAttention(H, 99, num_gqa_groups=G, qkv_format="bshd")(
         t["q"], t["k"], t["v"])),
    ("layer_unknown_cp_comm_type", dpa.InvalidArgumentError, "cp_comm_type",
     lambda t: DotProductAttention(H, D).set_context_parallel_group(
         _single_rank_group(), [0], cp_comm_type="ring")),
]


def _single_rank_group():
    import os
    import tempfile
    import torch.distributed as dist
    if not dist.is_initialized():
        path = os.path.join(tempfile.mkdtemp(), "init")
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    return dist.group.WORLD


def test_the_corpus_has_at_least_fifty_cases():
    assert len(CASES) >= 50


@pytest.mark.parametrize("name,cls,argument,call", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_naming_the_argument(name, cls, argument, call):
    with pytest.raises(cls) as error:
        call(tensors())
    assert isinstance(error.value, dpa.Error)
    assert error.value.argument == argument, str(error.value)
    assert argument in str(error.value)


@pytest.mark.parametrize("name,call", [
    ("bad_softcap", lambda a, t, o, l: dpa.direct.Attention(softcap=-1.0)),
    ("bad_k", lambda a, t, o, l: a(t["q"], t["k"][..., :4], t["v"], out=o, lse=l)),
    ("bad_sinks", lambda a, t, o, l: a(t["q"], t["k"], t["v"], sinks=torch.zeros(3), out=o,
                                       lse=l)),
    ("bad_lse_shape", lambda a, t, o, l: a(t["q"], t["k"], t["v"], out=o, lse=l[:, :2])),
    ("bad_out_dtype", lambda a, t, o, l: a(t["q"], t["k"], t["v"], out=o.double(), lse=l)),
])
def test_outputs_the_caller_passed_stay_untouched(name, call):
    t = tensors()
    attention = dpa.direct.Attention(causal=True)
    out = torch.full((B, S, H, D), 777.0)
    lse = torch.full((B, H, S), 777.0)
    with pytest.raises(dpa.Error):
        call(attention, t, out, lse)
    assert torch.all(out == 777.0) and torch.all(lse == 777.0)


def test_arrays_of_other_frameworks_through_dlpack_are_checked_too():
    q = np.zeros((1, 4, 2, 8), dtype=np.int64)
    config = dpa._dpa.make_config(
        qkv_format="bshd", mask_type="no_mask", window_left=-1, window_right=-1,
        bottom_right_diagonal=True, softcap=0.0, softmax_scale=None, softmax_type="vanilla",
        bias_type="no_bias", dropout=0.0, seed=0, layer_number=0, deterministic=False,
        backend="auto")
    with pytest.raises(dpa.InvalidArgumentError) as error:
        dpa._dpa.Attention(config).forward(q, q, q, q, q, None, None, None, None, None, None,
                                           None, None, None, None, 0, None)
    assert error.value.argument == "q"


def test_an_out_that_shares_memory_with_an_input_is_refused_and_the_input_kept():
    # docs/hardening.md, "Outputs apart from inputs": the call would read q after writing o.
    t = tensors()
    q = t["q"].clone()
    attention = dpa.direct.Attention(causal=True)
    with pytest.raises(dpa.InvalidArgumentError) as error:
        attention(t["q"], t["k"], t["v"], out=t["q"])
    assert error.value.argument == "o", str(error.value)
    assert torch.equal(t["q"], q)
    lse = torch.full((B, H, S), 777.0)
    with pytest.raises(dpa.InvalidArgumentError) as error:
        attention(t["q"], t["k"], t["v"], out=torch.empty(B, 1, H, D).expand(B, S, H, D), lse=lse)
    assert error.value.argument == "o", str(error.value)
    assert torch.all(lse == 777.0)
