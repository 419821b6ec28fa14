"""Gradients through autograd: torch.autograd.gradcheck in float64 on cpu_exact (finite
differences of the oracle itself), and the op's registration checked by opcheck."""

import pytest
import torch

import dpa


def small(requires_grad=True):
    torch.manual_seed(1)
    q = (1.5 * torch.randn(2, 5, 2, 4, dtype=torch.float64)).requires_grad_(requires_grad)
    k = (1.5 * torch.randn(2, 7, 1, 4, dtype=torch.float64)).requires_grad_(requires_grad)
    v = torch.randn(2, 7, 1, 4, dtype=torch.float64).requires_grad_(requires_grad)
    return q, k, v


@pytest.mark.parametrize("features", [
    {},
    {"softcap": 1.5, "causal": True},
    {"window_size": (2, 1), "softmax_type": "off-by-one"},
    {"alibi_slopes": torch.tensor([0.3, 0.7])},
])
def test_gradcheck_qkv(features):
    q, k, v = small()
    fn = lambda q, k, v: dpa.attention(q, k, v, backend="cpu_exact", **features)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-8, rtol=1e-6)


@pytest.mark.parametrize("bias_type", ["pre_scale", "post_scale"])
def test_gradcheck_bias(bias_type):
    q, k, v = small()
    bias = torch.randn(1, 2, 5, 7, dtype=torch.float64, requires_grad=True)
    fn = lambda q, k, v, bias: dpa.attention(q, k, v, bias=bias, bias_type=bias_type,
                                             softcap=2.0, backend="cpu_exact")
    assert torch.autograd.gradcheck(fn, (q, k, v, bias), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_sink_gradient_by_finite_differences():
    """sinks are fp32 by contract (gradcheck wants float64 leaves): central differences of the
    fp64 output in the sink, with a step exactly representable in fp32."""
    q, k, v = small(requires_grad=False)
    sinks = torch.tensor([0.75, -1.25], dtype=torch.float32, requires_grad=True)
    weight = torch.randn(2, 5, 2, 4, dtype=torch.float64)
    loss = lambda s: (dpa.attention(q, k, v, sinks=s, causal=True, backend="cpu_exact")
                      * weight).sum()
    loss(sinks).backward()
    step = 2.0 ** -10
    for h in range(2):
        plus, minus = sinks.detach().clone(), sinks.detach().clone()
        plus[h] += step
        minus[h] -= step
        numeric = (loss(plus) - loss(minus)) / (2 * step)
        assert abs(float(sinks.grad[h]) - float(numeric)) < 1e-6 * max(1.0, abs(float(numeric)))


def test_lse_is_not_differentiable():
    q, k, v = small()
    o, lse = dpa.attention(q, k, v, return_lse=True)
    assert o.requires_grad and not lse.requires_grad


def _op_args(with_sinks, with_bias, dropout):
    q, k, v = small()
    sinks = torch.tensor([0.5, -2.0], requires_grad=True) if with_sinks else None
    bias = torch.randn(1, 2, 5, 7, dtype=torch.float64, requires_grad=True) if with_bias else None
    rng = torch.tensor([5, 3], dtype=torch.int64) if dropout else None
    config = dpa.functional.resolve(
        qkv_format="bshd", causal=True, mask_type=None, window_size=(-1, -1),
        bottom_right_diagonal=None, softcap=2.0, softmax_scale=None, softmax_type=None,
        sinks=sinks, bias=bias, bias_type=None, dropout_p=0.2 if dropout else 0.0,
        layer_number=None, deterministic=False, backend="cpu", padded=False)
    return (q, k, v, None, None, None, None, bias, None, sinks, None, rng, *config)


@pytest.mark.parametrize("with_sinks,with_bias,dropout",
                         [(False, False, False), (True, False, False), (True, True, True)])
def test_opcheck(with_sinks, with_bias, dropout):
    torch.library.opcheck(torch.ops.dpa.forward.default, _op_args(with_sinks, with_bias, dropout))


def test_double_backward_raises_instead_of_dropping_terms():
    q, k, v = small()
    o = dpa.attention(q, k, v, causal=True)
    (grad_q,) = torch.autograd.grad((o ** 2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError):
        (grad_q ** 2).sum().backward()


def test_strided_bias_gets_its_gradient():
    q, k, v = small()
    dense = torch.randn(1, 2, 7, 5, dtype=torch.float64)
    bias = dense.transpose(-1, -2).requires_grad_()  # [1, 2, 5, 7], not contiguous
    dpa.attention(q, k, v, bias=bias, backend="cpu_exact").sum().backward()
    expected_bias = bias.detach().contiguous().requires_grad_()
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    dpa.attention(q2, k2, v2, bias=expected_bias, backend="cpu_exact").sum().backward()
    torch.testing.assert_close(bias.grad, expected_bias.grad)
