"""dpa's calls captured into CUDA graphs (torch.cuda.graph; its default capture mode, global, is
the strictest). A replay reads the captured tensors' current contents, so new inputs copied
into them must give what an eager call on those inputs gives, bit for bit: training steps
(forward and backward) and serving's decode steps, whose cache lengths grow between replays.
What a graph cannot replay is refused while capturing, naming the argument."""

import pytest
import torch

import dpa
from conftest import requires_cuda

pytestmark = requires_cuda


def _warm_up(step):
    """Runs step twice on a side stream, as torch.cuda.graph's documentation asks before a
    capture (lazy initialisation stays out of the graph)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)


def test_a_captured_training_step_replays_with_new_inputs():
    def leaf(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = leaf(2, 300, 8, 128), leaf(2, 300, 2, 128), leaf(2, 300, 2, 128)
    sinks = torch.randn(8, device="cuda", requires_grad=True)
    grad_o = torch.randn(2, 300, 8, 128, device="cuda", dtype=torch.bfloat16)

    def step():
        o = dpa.attention(q, k, v, causal=True, softcap=30.0, sinks=sinks, deterministic=True)
        return (o,) + torch.autograd.grad(o, (q, k, v, sinks), grad_o)

    _warm_up(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    previous = None
    for _ in range(2):
        with torch.no_grad():
            for t in (q, k, v, sinks, grad_o):
                t.copy_(torch.randn_like(t))
        graph.replay()
        eager = step()
        for name, got, want in zip(("o", "dq", "dk", "dv", "dsinks"), captured, eager):
            assert torch.equal(got, want), name
        # The new inputs moved every output: a replay of stale inputs could not pass.
        if previous is not None:
            for name, now, before in zip(("o", "dq", "dk", "dv", "dsinks"), captured, previous):
                assert not torch.equal(now, before), name
        previous = [t.clone() for t in captured]


@pytest.mark.parametrize("page_size", [None, 1, 16], ids=["contiguous", "page1", "page16"])
def test_a_captured_decode_step_replays_with_grown_caches(page_size):
    b, heads, groups, dim, capacity = 4, 16, 2, 128, 4096
    device, dtype = "cuda", torch.bfloat16
    if page_size is None:
        k_cache = torch.randn(b, capacity, groups, dim, device=device, dtype=dtype)
        block_table = None
    else:
        pages = capacity // page_size
        k_cache = torch.randn(b * pages, page_size, groups, dim, device=device, dtype=dtype)
        block_table = torch.randperm(b * pages, device=device).view(b, pages).to(torch.int32)
    v_cache = torch.randn_like(k_cache)
    cache_seqlens = torch.tensor([3000, 37, 1500, 0], device=device, dtype=torch.int32)
    q = torch.randn(b, 1, heads, dim, device=device, dtype=dtype)
    k_new = torch.randn(b, 1, groups, dim, device=device, dtype=dtype)
    v_new = torch.randn_like(k_new)
    sinks = torch.randn(heads, device=device)

    def step(keys, values):
        return dpa.attention_with_kvcache(q, keys, values, k_new, v_new,
                                          cache_seqlens=cache_seqlens, block_table=block_table,
                                          causal=True, softcap=20.0, sinks=sinks,
                                          return_lse=True)

    with torch.inference_mode():
        _warm_up(lambda: step(k_cache.clone(), v_cache.clone()))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            o, lse = step(k_cache, v_cache)
        previous = None
        for _ in range(3):  # decode: each step appends one token and attends one more
            cache_seqlens += 1
            for t in (q, k_new, v_new):
                t.copy_(torch.randn_like(t))
            k_eager, v_eager = k_cache.clone(), v_cache.clone()
            graph.replay()
            o_eager, lse_eager = step(k_eager, v_eager)
            assert torch.equal(o, o_eager)
            assert torch.equal(lse, lse_eager)
            assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)
            # The step moved the output: a replay of the captured lengths or tokens could not
            # pass the comparisons above and this one together.
            if previous is not None:
                assert not torch.equal(lse, previous)
            previous = lse.clone()


def test_capturing_a_call_that_reads_device_tables_is_refused_naming_the_stream():
    q = torch.randn(100, 4, 64, device="cuda", dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0, 60, 100], device="cuda", dtype=torch.int32)

    def step():
        return dpa.attention_varlen(q, q, q, cu_seqlens, cu_seqlens, 60, 60, causal=True)

    _warm_up(step)
    with pytest.raises(dpa.NotSupportedError, match="stream"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            step()
    step()  # the stream and the library still work


def test_capturing_dropout_with_a_drawn_seed_is_refused():
    q = torch.randn(2, 64, 4, 64, device="cuda", dtype=torch.bfloat16)

    def step(**seeding):
        return dpa.attention(q, q, q, dropout_p=0.1, **seeding)

    _warm_up(step)
    with pytest.raises(dpa.NotSupportedError, match="dropout_p"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            step()
    graph = torch.cuda.CUDAGraph()  # a fixed seed is the caller's choice: it captures
    with torch.cuda.graph(graph):
        o = step(seed=7, offset=0)
    graph.replay()
    assert torch.equal(o, step(seed=7, offset=0))
