"""dpa.attention_with_kvcache (issue 20) against the pure-PyTorch reference (reference.py): each
sequence's keys are the cache's first cache_seqlens[i] rows plus the new ones, attended as one
ordinary call. Contiguous and paged caches, packed (chunked-prefill) queries and appends,
features, the cache written in place, and the errors."""

import pytest
import torch

import dpa
import reference

H, G, D = 4, 2, 8


def make_cache(cached, page_size, capacity, generator):
    """Sequence i's cached keys and values, and a cache holding them: contiguous [b, capacity,
    G, D], or paged [pool, page_size, G, D] with a shuffled block table (unused pages garbage)."""
    b = len(cached)
    keys = [torch.randn(n, G, D, dtype=torch.float64, generator=generator) for n in cached]
    values = [torch.randn(n, G, D, dtype=torch.float64, generator=generator) for n in cached]
    if page_size is None:
        k_cache = 100 * torch.randn(b, capacity, G, D, dtype=torch.float64, generator=generator)
        v_cache = 100 * torch.randn(b, capacity, G, D, dtype=torch.float64, generator=generator)
        for i, n in enumerate(cached):
            k_cache[i, :n], v_cache[i, :n] = keys[i], values[i]
        return keys, values, k_cache, v_cache, None
    pages = capacity // page_size
    pool = b * pages + 2
    order = torch.randperm(pool, generator=generator)[: b * pages].view(b, pages)
    k_cache = 100 * torch.randn(pool, page_size, G, D, dtype=torch.float64, generator=generator)
    v_cache = 100 * torch.randn(pool, page_size, G, D, dtype=torch.float64, generator=generator)
    for i, n in enumerate(cached):
        for pos in range(n):
            page, row = order[i, pos // page_size], pos % page_size
            k_cache[page, row], v_cache[page, row] = keys[i][pos], values[i][pos]
    return keys, values, k_cache, v_cache, order.to(torch.int32)


def expected(q_rows, keys, values, *, causal, window, softcap, sinks, alibi=None):
    """Per sequence: the reference over all its keys, bottom-right aligned."""
    outs, lses = [], []
    for q, k, v in zip(q_rows, keys, values):
        heads, dim = q.shape[1], v.shape[2]
        if k.shape[0] == 0:
            outs.append(torch.zeros(q.shape[0], heads, dim, dtype=torch.float64))
            sink = (torch.full((heads,), float("-inf"), dtype=torch.float64) if sinks is None
                    else sinks.double())
            lses.append(sink.view(heads, 1).expand(heads, q.shape[0]))
            continue
        left, right = window
        if causal:
            right = 0
        o, lse = reference.attention(q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None],
                                     v.permute(1, 0, 2)[None], softcap=softcap,
                                     window=(left, right), sink=sinks, alibi=alibi)
        outs.append(o[0].permute(1, 0, 2))
        lses.append(lse[0])
    return outs, lses


# cpu_exact computes in fp64; the auto choice (the tiled cpu backend) in fp32.
TOLERANCE = {"cpu_exact": 1e-10, None: 1e-5}


@pytest.mark.parametrize("backend", list(TOLERANCE))
@pytest.mark.parametrize("page_size", [None, 1, 16, 64, 256])
@pytest.mark.parametrize("features", ["plain", "softcap_sink_window", "alibi"])
def test_decode_matches_reference(page_size, features, backend):
    generator = torch.Generator().manual_seed(3)
    cached = [37, 0, 300, 5]
    capacity = 512
    keys, values, k_cache, v_cache, table = make_cache(cached, page_size, capacity, generator)
    b = len(cached)
    q = torch.randn(b, 1, H, D, dtype=torch.float64, generator=generator) * 2
    k_new = torch.randn(b, 1, G, D, dtype=torch.float64, generator=generator)
    v_new = torch.randn(b, 1, G, D, dtype=torch.float64, generator=generator)
    options = {}
    softcap, window, sinks, alibi = 0.0, (-1, -1), None, None
    if features == "softcap_sink_window":
        softcap, window = 3.0, (15, 0)
        sinks = torch.randn(H, generator=generator) * 2
        options = dict(softcap=softcap, window_size=window, sinks=sinks)
    elif features == "alibi":
        alibi = torch.tensor([0.5, 0.25, 0.125, 0.0625])
        options = dict(alibi_slopes=alibi)
    seqlens = torch.tensor(cached, dtype=torch.int32)
    o, lse = dpa.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                        block_table=table, causal=True, return_lse=True,
                                        backend=backend, **options)
    all_keys = [torch.cat([k, k_new[i]]) for i, k in enumerate(keys)]
    all_values = [torch.cat([v, v_new[i]]) for i, v in enumerate(values)]
    want_o, want_lse = expected(list(q), all_keys, all_values, causal=True, window=window,
                                softcap=softcap, sinks=sinks, alibi=alibi)
    tol = TOLERANCE[backend]
    torch.testing.assert_close(o, torch.stack(want_o), rtol=tol, atol=tol)
    torch.testing.assert_close(lse, torch.stack(want_lse).float(), rtol=1e-5, atol=1e-5)
    # The new tokens are in the cache, at position cache_seqlens[i].
    for i, n in enumerate(cached):
        if table is None:
            got = k_cache[i, n]
        else:
            got = k_cache[table[i, n // page_size], n % page_size]
        assert torch.equal(got, k_new[i, 0])
    if features != "plain":  # the features move the result
        plain, _ = expected(list(q), all_keys, all_values, causal=True, window=(-1, -1),
                            softcap=0.0, sinks=None)
        assert (torch.stack(plain) - o).abs().max() > 1e-2


def test_chunked_prefill_mixed_batch():
    """One packed call: a decode, a first prefill chunk, a later chunk over a cache."""
    generator = torch.Generator().manual_seed(5)
    cached, added = [40, 0, 9], [1, 12, 5]
    keys, values, k_cache, v_cache, table = make_cache(cached, 16, 64, generator)
    cu = torch.tensor([0, 1, 13, 18], dtype=torch.int32)
    q = torch.randn(18, H, D, dtype=torch.float64, generator=generator)
    k_new = torch.randn(18, G, D, dtype=torch.float64, generator=generator)
    v_new = torch.randn(18, G, D, dtype=torch.float64, generator=generator)
    sinks = torch.randn(H, generator=generator)
    o = dpa.attention_with_kvcache(q, k_cache, v_cache, k_new, v_new,
                                   cache_seqlens=torch.tensor(cached, dtype=torch.int32),
                                   block_table=table, cu_seqlens_q=cu, cu_seqlens_k_new=cu,
                                   causal=True, softcap=4.0, sinks=sinks,
                                   backend="cpu_exact")
    bounds = cu.tolist()
    rows = [slice(bounds[i], bounds[i + 1]) for i in range(3)]
    want, _ = expected([q[r] for r in rows],
                       [torch.cat([keys[i], k_new[r]]) for i, r in enumerate(rows)],
                       [torch.cat([values[i], v_new[r]]) for i, r in enumerate(rows)],
                       causal=True, window=(-1, -1), softcap=4.0, sinks=sinks)
    torch.testing.assert_close(o, torch.cat(want), rtol=1e-10, atol=1e-10)


def test_rows_past_the_last_sequence_are_empty_rows():
    """A packed q longer than cu_seqlens_q covers: those rows get o = 0 and the sink's LSE."""
    generator = torch.Generator().manual_seed(6)
    keys, values, k_cache, v_cache, table = make_cache([9, 4], 4, 16, generator)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32)
    q = torch.randn(5, H, D, dtype=torch.float64, generator=generator)  # rows 2..4: no sequence
    sinks = torch.randn(H, generator=generator)
    o, lse = dpa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=torch.tensor(
        [9, 4], dtype=torch.int32), block_table=table, cu_seqlens_q=cu, causal=True,
        sinks=sinks, return_lse=True, backend="cpu_exact")
    want, want_lse = expected([q[0:1], q[1:2]], keys, values, causal=True, window=(-1, -1),
                              softcap=0.0, sinks=sinks)
    torch.testing.assert_close(o[:2], torch.cat(want), rtol=1e-10, atol=1e-10)
    assert torch.equal(o[2:], torch.zeros_like(o[2:]))
    torch.testing.assert_close(lse[:, 2:], sinks.double().view(H, 1).expand(H, 3).float())


def test_an_int_cache_seqlens_and_no_append():
    generator = torch.Generator().manual_seed(7)
    keys, values, k_cache, v_cache, _ = make_cache([6, 6], None, 8, generator)
    q = torch.randn(2, 3, H, D, dtype=torch.float64, generator=generator)
    o = dpa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=6, backend="cpu_exact")
    want, _ = expected(list(q), keys, values, causal=False, window=(-1, -1), softcap=0.0,
                       sinks=None)
    torch.testing.assert_close(o, torch.stack(want), rtol=1e-10, atol=1e-10)


def test_refusals_name_the_argument_and_leave_the_cache():
    generator = torch.Generator().manual_seed(9)
    _, _, k_cache, v_cache, table = make_cache([5, 3], 4, 8, generator)
    q = torch.randn(2, 1, H, D, dtype=torch.float64)
    k_new = torch.randn(2, 1, G, D, dtype=torch.float64)
    before = k_cache.clone()
    bad = table.clone()
    bad[0, 1] = 99
    with pytest.raises(dpa.InvalidArgumentError, match="block_table"):
        dpa.attention_with_kvcache(q, k_cache, v_cache, k_new, k_new.clone(),
                                   cache_seqlens=torch.tensor([5, 3], dtype=torch.int32),
                                   block_table=bad)
    with pytest.raises(dpa.InvalidArgumentError, match="cache_seqlens"):
        dpa.attention_with_kvcache(q, k_cache, v_cache, k_new, k_new.clone(), cache_seqlens=8,
                                   block_table=table)
    with pytest.raises(dpa.InvalidArgumentError, match="sinks"):
        dpa.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=3, block_table=table,
                                   sinks=torch.zeros(H + 1))
    with pytest.raises(dpa.NotSupportedError, match="q"):
        dpa.attention_with_kvcache(q.requires_grad_(), k_cache, v_cache, cache_seqlens=3,
                                   block_table=table)
    assert torch.equal(k_cache, before)


def test_compiles_whole_and_appends_like_eager():
    """torch.compile(fullgraph=True) traces the call (a custom op that mutates the caches): the
    same outputs and the same caches as eager mode, two decode steps in one graph."""
    generator = torch.Generator().manual_seed(11)
    _, _, k_cache, v_cache, table = make_cache([5, 2], 4, 8, generator)
    q = torch.randn(2, 1, H, D, dtype=torch.float64, generator=generator)
    new = [torch.randn(2, 1, G, D, dtype=torch.float64, generator=generator) for _ in range(4)]

    def two_steps(q, k_cache, v_cache, table):
        lens = torch.tensor([5, 2], dtype=torch.int32)
        first = dpa.attention_with_kvcache(q, k_cache, v_cache, new[0], new[1],
                                           cache_seqlens=lens, block_table=table, causal=True,
                                           softcap=3.0)
        second = dpa.attention_with_kvcache(first * 0.5, k_cache, v_cache, new[2], new[3],
                                            cache_seqlens=lens + 1, block_table=table,
                                            causal=True, softcap=3.0)
        return second

    eager_caches = (k_cache.clone(), v_cache.clone())
    want = two_steps(q, *eager_caches, table)
    torch._dynamo.reset()
    compiled = torch.compile(two_steps, fullgraph=True, backend="aot_eager")
    got = compiled(q, k_cache, v_cache, table)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert torch.equal(k_cache, eager_caches[0]) and torch.equal(v_cache, eager_caches[1])


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
@pytest.mark.parametrize("page_size", [None, 16, 64])
@pytest.mark.parametrize("features", ["plain", "softcap_sink_window"])
def test_cuda_decode_matches_reference(page_size, features):
    """The device kernels (bf16, d = 128, GQA 8 / 2, keys enough to split) against the fp64
    reference on the same rounded inputs; the new tokens land in the device cache."""
    heads, kv_heads, dim = 8, 2, 128
    generator = torch.Generator().manual_seed(17)
    cached = [1500, 0, 333]
    b, capacity = len(cached), 2048
    rounded = lambda t: t.to(torch.bfloat16).double()  # noqa: E731
    keys = [rounded(torch.randn(n, kv_heads, dim, generator=generator)) for n in cached]
    values = [rounded(torch.randn(n, kv_heads, dim, generator=generator)) for n in cached]
    if page_size is None:
        k_cache = torch.randn(b, capacity, kv_heads, dim, generator=generator)
        v_cache = torch.randn(b, capacity, kv_heads, dim, generator=generator)
        table = None
        for i, n in enumerate(cached):
            k_cache[i, :n], v_cache[i, :n] = keys[i], values[i]
    else:
        pages = capacity // page_size
        order = torch.randperm(b * pages + 3, generator=generator)[: b * pages].view(b, pages)
        k_cache = torch.randn(b * pages + 3, page_size, kv_heads, dim, generator=generator)
        v_cache = torch.randn(b * pages + 3, page_size, kv_heads, dim, generator=generator)
        for i, n in enumerate(cached):
            positions = torch.arange(n)
            k_cache[order[i, positions // page_size], positions % page_size] = keys[i].float()
            v_cache[order[i, positions // page_size], positions % page_size] = values[i].float()
        table = order.to(torch.int32).cuda()
    k_cache, v_cache = k_cache.bfloat16().cuda(), v_cache.bfloat16().cuda()
    q = rounded(torch.randn(b, 1, heads, dim, generator=generator) * 2)
    k_new = rounded(torch.randn(b, 1, kv_heads, dim, generator=generator))
    v_new = rounded(torch.randn(b, 1, kv_heads, dim, generator=generator))
    softcap, window, sinks = 0.0, (-1, -1), None
    options = {}
    if features == "softcap_sink_window":
        softcap, window = 5.0, (127, 0)
        sinks = torch.randn(heads, generator=generator) * 2
        options = dict(softcap=softcap, window_size=window, sinks=sinks.cuda())
    seqlens = torch.tensor(cached, dtype=torch.int32, device="cuda")
    with torch.no_grad():
        o, lse = dpa.attention_with_kvcache(
            q.bfloat16().cuda(), k_cache, v_cache, k_new.bfloat16().cuda(),
            v_new.bfloat16().cuda(), cache_seqlens=seqlens, block_table=table, causal=True,
            return_lse=True, **options)
    all_keys = [torch.cat([k, k_new[i]]) for i, k in enumerate(keys)]
    all_values = [torch.cat([v, v_new[i]]) for i, v in enumerate(values)]
    want_o, want_lse = expected(list(q), all_keys, all_values, causal=True, window=window,
                                softcap=softcap, sinks=sinks)
    want = torch.stack(want_o)
    assert (o.double().cpu() - want).norm() / want.norm() < 2e-2
    torch.testing.assert_close(lse.cpu(), torch.stack(want_lse).float(), rtol=1e-3, atol=5e-3)
    for i, n in enumerate(cached):
        got = k_cache[i, n] if table is None else k_cache[table[i, n // page_size],
                                                          n % page_size]
        assert torch.equal(got.cpu(), k_new[i, 0].bfloat16())


@CUDA
def test_cuda_refuses_what_its_kernels_do_not_take():
    """Fail closed: a head dim the kernels lack is NotSupportedError naming q, cache untouched."""
    k_cache = torch.randn(2, 8, 2, 8, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(2, 8, 2, 8, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(2, 1, 4, 8, device="cuda", dtype=torch.bfloat16)
    k_new = torch.randn(2, 1, 2, 8, device="cuda", dtype=torch.bfloat16)
    before = k_cache.clone()
    with pytest.raises(dpa.NotSupportedError, match="q"):
        dpa.attention_with_kvcache(q, k_cache, v_cache, k_new, k_new.clone(),
                                   cache_seqlens=torch.tensor([5, 3], dtype=torch.int32,
                                                              device="cuda"))
    assert torch.equal(k_cache, before)
