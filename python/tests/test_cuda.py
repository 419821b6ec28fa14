"""The CUDA backends through the torch layer, in fp16 and bf16, against the float64 reference
run on the same (rounded) inputs; and the call path's promises on the GPU: the caller's
stream, no synchronisation in the torch layer, the workspace from PyTorch's allocator."""

import pytest
import torch

import dpa
from cases import CASES, Case, make_inputs, reference_result, rel, run_dpa
from conftest import requires_cuda

pytestmark = requires_cuda

# Relative-norm bounds (o, gradients): fp16 keeps 11 bits, bf16 8; P and dS are rounded to the
# storage dtype before their GEMMs, as in every one-kernel backward.
BOUND = {torch.float16: 4e-3, torch.bfloat16: 2.5e-2}

# The CPU cases at a head dim every CUDA kernel has (64), with tiling-breaking lengths.
GPU_CASES = [Case(c.name, c.make_extra, c.dpa_args, c.ref_args,
                  shape=(2, 97, 130, 4, 2, 64, 64) if c.shape[5] == c.shape[6]
                  else (2, 97, 130, 4, 2, 192, 128),
                  qkv_format=c.qkv_format, differentiable=c.differentiable)
             for c in CASES]


def _flash_has(case):
    # cuda_flash: no arbitrary mask, no bias gradient (the selector refuses; explain says why).
    return case.name not in ("arbitrary_mask", "bias_post_scale", "bias_pre_scale")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["cuda_flash", "cuda_unfused"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_cuda_backend_matches_the_reference(case, backend, dtype):
    if backend == "cuda_flash" and not _flash_has(case):
        with pytest.raises(dpa.NotSupportedError):  # refused with reasons, never dropped
            run_dpa(case, make_inputs(case, dtype, "cuda"), backend)
        return
    x = make_inputs(case, dtype, "cuda")
    o_ref, lse_ref, grads_ref = reference_result(case, x)  # from the rounded inputs
    o, lse, grads = run_dpa(case, x, backend)
    bound = BOUND[dtype]
    assert rel(o, o_ref) < bound
    rows = torch.isfinite(lse_ref)
    assert torch.equal(torch.isfinite(lse.cpu()), rows)
    assert rel(lse.cpu()[rows], lse_ref[rows]) < 1e-3
    for name, grad_ref in grads_ref.items():
        assert rel(grads[name], grad_ref) < 2 * bound, name


def test_runs_on_the_callers_stream_without_synchronising():
    q = torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    sinks = torch.randn(4, device="cuda", requires_grad=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda.set_sync_debug_mode("error")  # any synchronising torch call raises
        try:
            o = dpa.attention(q, q, q, causal=True, softcap=50.0, sinks=sinks)
            o.sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    stream.synchronize()
    # The same result on the default stream: the work really ran on `stream`, in order.
    o_default = dpa.attention(q.detach(), q.detach(), q.detach(), causal=True, softcap=50.0,
                              sinks=sinks.detach())
    torch.testing.assert_close(o.detach(), o_default)


def test_workspace_comes_from_the_caching_allocator_and_is_sized_exactly(monkeypatch):
    from dpa import _views, ops
    requests = []

    def counting_allocator(tensor):
        allocator = _views.allocator_for(tensor)

        def allocate(nbytes):
            requests.append(nbytes)
            return allocator(nbytes)
        return allocate

    monkeypatch.setattr(ops, "allocator_for", counting_allocator)
    torch.cuda.synchronize()
    before = dpa._dpa.workspace_shortfall_bytes()
    q = torch.randn(1, 1, 8, 128, device="cuda", dtype=torch.bfloat16)  # decode: split-KV
    k = torch.randn(1, 4096, 8, 128, device="cuda", dtype=torch.bfloat16)
    for backend in ("cuda_flash", "cuda_unfused"):
        dpa.attention(q, k, k, backend=backend)
    qq = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.float16, requires_grad=True)
    sinks = torch.randn(8, device="cuda", requires_grad=True)
    for backend in ("cuda_flash", "cuda_unfused"):
        dpa.attention(qq, qq, qq, sinks=sinks, backend=backend).sum().backward()
    # strided (packed by cuda_unfused) and thd inputs
    # A sequence stride of 0 (one row broadcast over the sequence): cuda_unfused packs it.
    strided = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.float16).expand(2, 300, 8, 128)
    for backend in ("cuda_flash", "cuda_unfused"):
        dpa.attention(strided, strided, strided, causal=True, backend=backend)
    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    thd = torch.randn(300, 8, 128, device="cuda", dtype=torch.bfloat16)
    for backend in ("cuda_flash", "cuda_unfused"):
        dpa.attention_varlen(thd, thd, thd, cu, cu, causal=True, backend=backend)
    torch.cuda.synchronize()
    assert dpa._dpa.workspace_shortfall_bytes() == before
    assert len(requests) >= 10 and all(n > 0 for n in requests)


def _on(backend, q, k, bias=None):
    """o, lse on `backend` (cpu takes fp32 copies), back on the host in fp32."""
    device = "cpu" if backend == "cpu" else "cuda"
    convert = (lambda t: t.float()) if backend == "cpu" else (lambda t: t.to(device))
    o, lse = dpa.attention(convert(q), convert(k), convert(k),
                           bias=None if bias is None else convert(bias), backend=backend,
                           return_lse=True)
    return o.float().cpu(), lse.cpu()


@pytest.mark.parametrize("backend", ["cpu", "cuda_flash", "cuda_unfused"])
def test_nan_in_q_or_k_makes_exactly_its_rows_nan(backend):
    """docs/decisions.md's non-finite contract, the same on the host and the GPU."""
    torch.manual_seed(3)
    q = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    k = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    q[0, 1, 0, 0] = float("nan")  # row 1 of head 0
    k[0, 4, 1, 0] = float("nan")  # key 4 of head 1: every row of head 1 sees it
    o, lse = _on(backend, q, k)
    assert torch.isnan(lse[0, 0, 1]) and torch.isnan(o[0, 1, 0]).all()
    assert torch.isfinite(lse[0, 0, [0, 2, 3, 4, 5, 6, 7]]).all()
    assert torch.isnan(lse[0, 1]).all()


@pytest.mark.parametrize("backend", ["cpu", "cuda_flash", "cuda_unfused"])
def test_an_all_nan_row_stays_nan_through_the_split_kv_merge(backend):
    """One query row against many keys is the decode shape, which cuda_flash splits over the
    keys and merges (merge_partials): a NaN row must stay NaN there too."""
    torch.manual_seed(4)
    q = torch.randn(1, 1, 2, 64, dtype=torch.float16)
    k = torch.randn(1, 8192, 2, 64, dtype=torch.float16)
    q[0, 0, 0] = float("nan")  # every logit of head 0's row is NaN
    o, lse = _on(backend, q, k)
    assert torch.isnan(lse[0, 0, 0]) and torch.isnan(o[0, 0, 0]).all()
    assert torch.isfinite(lse[0, 1, 0]) and torch.isfinite(o[0, 0, 1]).all()


@pytest.mark.parametrize("backend", ["cpu", "cuda_unfused"])
def test_minus_inf_rows_are_empty_and_nan_among_them_stays(backend):
    torch.manual_seed(3)
    q = torch.randn(1, 8, 2, 64, dtype=torch.float16)
    k = torch.randn(1, 16, 2, 64, dtype=torch.float16)
    bias = torch.zeros(1, 1, 8, 16, dtype=torch.float16)
    bias[0, 0, 3] = float("-inf")  # row 3 sees nothing
    bias[0, 0, 5] = float("-inf")
    bias[0, 0, 5, 7] = float("nan")  # row 5: a NaN among -inf
    o, lse = _on(backend, q, k, bias)
    assert torch.equal(o[0, 3], torch.zeros_like(o[0, 3]))
    assert torch.isneginf(lse[0, :, 3]).all()
    assert torch.isnan(lse[0, :, 5]).all() and torch.isnan(o[0, 5]).all()
    assert torch.isfinite(lse[0, :, [0, 1, 2, 4, 6, 7]]).all()
