"""Every feature of DESIGN.md §3-5 through dpa.attention on the host backends, against the
pure-PyTorch reference (reference.py): each case first shows that its feature moves the
reference by more than 10x the tolerance, then compares o, lse and every gradient."""

import pytest
import torch

import dpa
from cases import CASES, loss_weight, make_inputs, reference_result, rel, to_dpa_layout

# Relative-norm tolerances in float64: cpu_exact follows the spec in fp64; cpu accumulates in
# fp32 (docs/cpu_backend.md).
TOLERANCE = {"cpu_exact": 1e-10, "cpu": 2e-6}


def run_dpa(case, x, backend):
    """o, lse and the gradients of sum(o * w) by name."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
    args = case.dpa_args(x)
    leaves = {"q": q, "k": k, "v": v}
    for name in case.differentiable:
        leaves[name] = args[name].detach().clone().requires_grad_()
        args[name] = leaves[name]
    o, lse = dpa.attention(q, k, v, qkv_format=case.qkv_format, return_lse=True,
                           backend=backend, **args)
    b, H = (o.shape[0], o.shape[2]) if case.qkv_format == "bshd" else (o.shape[1], o.shape[2])
    sq = o.shape[1] if case.qkv_format == "bshd" else o.shape[0]
    weight = loss_weight((b, H, sq, o.shape[3]))
    (o * to_dpa_layout(weight, case.qkv_format).to(o.dtype)).sum().backward()
    return o.detach(), lse.detach(), {name: leaf.grad for name, leaf in leaves.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_feature_moves_the_reference(case):
    if case.name in ("plain", "mqa", "head_dims_differ", "sbhd"):
        pytest.skip("a shape or layout, not a feature")
    x = make_inputs(case)
    o_with, _, _ = reference_result(case, x, with_feature=True)
    o_without, _, _ = reference_result(case, x, with_feature=False)
    assert rel(o_with, o_without) > 10 * max(TOLERANCE.values())


@pytest.mark.parametrize("backend", ["cpu_exact", "cpu"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_backend_matches_the_reference(case, backend):
    x = make_inputs(case)
    o_ref, lse_ref, grads_ref = reference_result(case, x)
    o, lse, grads = run_dpa(case, x, backend)
    tol = TOLERANCE[backend]
    assert rel(o, o_ref) < tol
    rows = torch.isfinite(lse_ref)  # padded rows: -inf in both
    assert torch.equal(torch.isfinite(lse), rows)
    assert rel(lse[rows], lse_ref[rows]) < stored(lse, tol)
    for name, grad_ref in grads_ref.items():
        assert grads[name] is not None, f"no gradient for {name}"
        assert rel(grads[name], grad_ref) < stored(grads[name], tol), name


def stored(t, tol):
    """lse and dsinks are fp32 by contract: their rounding bounds the error from below."""
    return max(tol, 1e-6) if t.dtype == torch.float32 else tol
