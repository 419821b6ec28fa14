"""The rest of the Python surface: varlen (thd), the TE-style module, explain, bad input from
Python (dpa.Error subclasses naming the argument) and arrays of other frameworks."""

import numpy as np
import pytest
import torch

import dpa
import reference
from dpa.torch import DotProductAttention


def test_varlen_matches_each_sequence_alone():
    torch.manual_seed(2)
    lengths_q, lengths_kv = [5, 0, 9], [7, 3, 9]  # an empty query sequence too
    H, G, d = 4, 2, 16
    cu = lambda n: torch.tensor([0] + list(np.cumsum(n)), dtype=torch.int32)
    q = 1.5 * torch.randn(sum(lengths_q), H, d, dtype=torch.float64)
    k = 1.5 * torch.randn(sum(lengths_kv), G, d, dtype=torch.float64)
    v = torch.randn(sum(lengths_kv), G, d, dtype=torch.float64)
    sinks = 2.0 * torch.randn(H)
    o, lse = dpa.attention_varlen(q, k, v, cu(lengths_q), cu(lengths_kv), max(lengths_q),
                                  max(lengths_kv), causal=True, softcap=2.0, sinks=sinks,
                                  return_lse=True)
    assert lse.shape == (H, sum(lengths_q))
    start_q = start_kv = 0
    for lq, lk in zip(lengths_q, lengths_kv):
        qs = q[start_q:start_q + lq].permute(1, 0, 2)[None]
        ks = k[start_kv:start_kv + lk].permute(1, 0, 2)[None]
        vs = v[start_kv:start_kv + lk].permute(1, 0, 2)[None]
        o_ref, lse_ref = reference.attention(qs, ks, vs, window=(-1, 0), softcap=2.0,
                                             sink=sinks)
        torch.testing.assert_close(o[start_q:start_q + lq], o_ref[0].permute(1, 0, 2),
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lse[:, start_q:start_q + lq], lse_ref[0].float(),
                                   rtol=1e-5, atol=1e-5)
        start_q, start_kv = start_q + lq, start_kv + lk


def test_varlen_max_seqlen_is_checked():
    q = torch.randn(9, 2, 16)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)
    with pytest.raises(dpa.InvalidArgumentError) as error:
        dpa.attention_varlen(q, q, q, cu, cu, 3, 5)
    assert error.value.argument == "max_seqlen_q"


def test_module_matches_functional_with_te_names():
    torch.manual_seed(3)
    attention = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd",
                                    attn_mask_type="causal", softmax_type="learnable",
                                    softcap=3.0)
    attention.softmax_offset.data = 3.0 * torch.randn(4)
    q = 1.5 * torch.randn(2, 11, 4, 16)
    k, v = 1.5 * torch.randn(2, 11, 2, 16), torch.randn(2, 11, 2, 16)
    out = attention(q, k, v)
    assert out.shape == (2, 11, 64)  # heads merged, as TE returns them
    expected = dpa.attention(q, k, v, mask_type="causal", softcap=3.0,
                             sinks=attention.softmax_offset)
    torch.testing.assert_close(out, expected.flatten(-2))
    out.sum().backward()
    assert attention.softmax_offset.grad is not None
    assert attention.softmax_offset.grad.abs().sum() > 0


def test_module_per_call_overrides_reach_the_kernel():
    """Plumbing (DESIGN.md §9): the per-call mask, window, bias and alibi are honoured."""
    torch.manual_seed(4)
    attention = DotProductAttention(2, 8, qkv_format="sbhd", attn_mask_type="no_mask")
    q = 1.5 * torch.randn(9, 1, 2, 8)
    base = attention(q, q, q)
    for overrides, functional in [
        ({"attn_mask_type": "causal"}, {"mask_type": "causal"}),
        ({"window_size": (2, 2)}, {"window_size": (2, 2)}),
        ({"core_attention_bias_type": "alibi"},
         {"alibi_slopes": dpa.torch.dot_product_attention.default_alibi_slopes(2)}),
    ]:
        out = attention(q, q, q, **overrides)
        expected = dpa.attention(q, q, q, qkv_format="sbhd", **functional).flatten(-2)
        assert (out - base).abs().max() > 1e-3, overrides
        torch.testing.assert_close(out, expected)
    bias = torch.randn(1, 2, 9, 9)
    out = attention(q, q, q, core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    expected = dpa.attention(q, q, q, qkv_format="sbhd", bias=bias).flatten(-2)
    torch.testing.assert_close(out, expected)


def test_module_dropout_only_in_training():
    attention = DotProductAttention(2, 8, qkv_format="bshd", attn_mask_type="no_mask",
                                    attention_dropout=0.5)
    q = torch.randn(1, 16, 2, 8)
    attention.eval()
    torch.testing.assert_close(attention(q, q, q), dpa.attention(q, q, q).flatten(-2))
    attention.train()
    assert (attention(q, q, q) - attention(q, q, q)).abs().max() > 1e-3  # fresh masks


def test_explain_returns_every_backend():
    q = torch.randn(1, 8, 2, 16)
    explanation = dpa.explain(q, q, q, causal=True, softcap=30.0)
    assert explanation.chosen == "cpu"
    names = [v.backend for v in explanation.verdicts]
    assert "cpu_exact" in names and "cpu" in names
    forced = dpa.explain(q, q, q, backend="cuda_flash")
    assert forced.chosen is None and forced.forced
    assert any(not v.eligible and v.reasons for v in forced.verdicts)


# ---- Bad input: a dpa.Error subclass naming the argument ----

def _raises(cls, argument, fn):
    with pytest.raises(cls) as error:
        fn()
    assert isinstance(error.value, dpa.Error)
    assert error.value.argument == argument, str(error.value)
    return error.value


def test_wrong_dtype_is_a_type_error():
    q = torch.randn(1, 4, 2, 8)
    error = _raises(dpa.DTypeError, "q", lambda: dpa.attention(q.long(), q, q))
    assert isinstance(error, TypeError)
    _raises(dpa.InvalidArgumentError, "k", lambda: dpa.attention(q, q.double(), q))


def test_other_frameworks_tensors_are_type_errors():
    q = torch.randn(1, 4, 2, 8)
    _raises(dpa.DTypeError, "v", lambda: dpa.attention(q, q, q.numpy()))


def test_bad_shapes_strides_and_values_name_the_argument():
    q = torch.randn(1, 4, 2, 8)
    _raises(dpa.InvalidArgumentError, "k", lambda: dpa.attention(q, q[:, :, :, :4], q))
    _raises(dpa.InvalidArgumentError, "q",
            lambda: dpa.attention(q.transpose(2, 3).contiguous().transpose(2, 3), q, q))
    _raises(dpa.InvalidArgumentError, "softcap", lambda: dpa.attention(q, q, q, softcap=-1.0))
    _raises(dpa.InvalidArgumentError, "mask_type", lambda: dpa.attention(q, q, q,
                                                                         mask_type="diagonal"))
    _raises(dpa.InvalidArgumentError, "sinks",
            lambda: dpa.attention(q, q, q, sinks=torch.zeros(3)))
    _raises(dpa.InvalidArgumentError, "qkv_format",
            lambda: dpa.attention(q, q, q, qkv_format="thd"))
    _raises(dpa.InvalidArgumentError, "dropout_p", lambda: dpa.attention(q, q, q, dropout_p=1.0))


def test_forced_backend_that_cannot_honour_lists_reasons():
    q = torch.randn(1, 4, 2, 8)
    error = _raises(dpa.NotSupportedError, "backend",
                    lambda: dpa.attention(q, q, q, backend="cuda_flash"))
    assert isinstance(error, RuntimeError)
    assert "cuda_flash" in str(error)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_mixed_devices_are_rejected():
    q = torch.randn(1, 4, 2, 64, dtype=torch.float16)
    _raises(dpa.InvalidArgumentError, "k", lambda: dpa.attention(q.cuda(), q, q.cuda()))


# ---- Arrays of other frameworks through the extension (DLPack) ----

def test_numpy_arrays_through_dlpack():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 6, 2, 8))
    o, lse = np.empty_like(q), np.empty((1, 2, 6), dtype=np.float32)
    config = dpa._dpa.make_config(
        qkv_format="bshd", mask_type="causal", window_left=-1, window_right=0,
        bottom_right_diagonal=True, softcap=2.0, softmax_scale=None, softmax_type="vanilla",
        bias_type="no_bias", dropout=0.0, seed=0, layer_number=0, deterministic=False,
        backend="auto")
    ran = dpa._dpa.Attention(config).forward(q, q, q, o, lse, None, None, None, None, None,
                                             None, None, None, None, None, 0, None)
    assert ran == "cpu"
    t = torch.from_numpy(q)
    expected = dpa.attention(t, t, t, mask_type="causal", softcap=2.0)
    np.testing.assert_allclose(o, expected.numpy(), rtol=1e-6, atol=1e-7)


def test_importing_dpa_before_torch_leaves_torch_working():
    """The extension and torch share CUDA libraries by soname; dpa loads torch's first."""
    import subprocess
    import sys
    code = "import dpa, torch; torch.zeros(1); assert hasattr(dpa, 'attention')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
