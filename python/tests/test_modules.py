"""dpa.torch.MultiheadAttention and TransformerLayer (issue 19): each against a pure-PyTorch
forward built from the same weights and the fp64 reference attention, the features moving
the result first; the constructor / per-forward plumbing of the cap, the sinks and the window
into both attentions of a decoder layer; qk-layer-scaling; rotary embeddings."""

import pytest
import torch

import dpa
import reference
from dpa.torch import (MultiheadAttention, RotaryPositionEmbedding, TransformerLayer,
                       apply_rotary_pos_emb)

TOL = 1e-10  # fp64 end to end on cpu_exact


def reference_mha(m, x, encoder_output=None, softcap=None, window=None, causal=True,
                  rotary=None):
    """The module's forward by hand: its weights, reference.attention in fp64 ([s, b, e])."""
    core = m.core_attention
    H, G = core.num_attention_heads, core.num_gqa_groups
    dqk, dv = m.dims
    if m.qkv is not None:
        q, k, v = m.qkv(x).split([H * dqk, G * dqk, G * dv], dim=-1)
    else:
        src = x if encoder_output is None else encoder_output
        q = m.query(x)
        k, v = (m.key_value(src).split([G * dqk, G * dv], dim=-1) if m.key_value is not None
                else (m.key(src), m.value(src)))
    s, b = x.shape[0], x.shape[1]
    skv = k.shape[0]
    q, k, v = q.view(s, b, H, dqk), k.view(skv, b, G, dqk), v.view(skv, b, G, dv)
    if rotary is not None:
        q = apply_rotary_pos_emb(q, rotary, "sbhd")
        k = apply_rotary_pos_emb(k, rotary, "sbhd")
    cap = m.softcap if softcap is None else softcap
    if window is None:
        window = m.window_size or ((-1, 0) if causal else (-1, -1))
    sink = core.softmax_offset if core.softmax_type == "learnable" else None
    o, _ = reference.attention(q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3),
                               v.permute(1, 2, 0, 3), softcap=cap, window=window,
                               bottom_right=True, sink=sink)
    return m.proj(o.permute(2, 0, 1, 3).reshape(s, b, H * dv))


def make_mha(**kwargs):
    args = dict(hidden_size=32, num_attention_heads=4, attention_dropout=0.0,
                params_dtype=torch.float64)
    args.update(kwargs)
    m = MultiheadAttention(**args)
    m.core_attention.backend = "cpu_exact"
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, 0.5)
    return m


def rel(a, b):
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("gqa", [4, 2])
def test_self_attention_matches_reference(fuse, gqa):
    m = make_mha(num_gqa_groups=gqa, fuse_qkv_params=fuse, softcap=2.0,
                 softmax_type="learnable")
    x = torch.randn(9, 2, 32, dtype=torch.float64)
    want = reference_mha(m, x)
    # The features must move the result (DESIGN.md §9): the cap, and the sinks.
    assert rel(reference_mha(m, x, softcap=0.0), want) > 1e3 * TOL
    with torch.no_grad():
        m.core_attention.softmax_offset.normal_(0, 3)
    want = reference_mha(m, x)
    assert rel(m(x), want) < TOL


def test_cross_attention_matches_reference():
    m = make_mha(attention_type="cross", attn_mask_type="no_mask", num_gqa_groups=2,
                 fuse_qkv_params=True, softcap=1.5)
    x = torch.randn(5, 2, 32, dtype=torch.float64)
    encoder = torch.randn(11, 2, 32, dtype=torch.float64)
    want = reference_mha(m, x, encoder, causal=False)
    assert rel(m(x, encoder_output=encoder), want) < TOL
    with pytest.raises(dpa.InvalidArgumentError, match="encoder_output"):
        m(x)


def test_forward_overrides_fall_back_to_the_constructor():
    m = make_mha(softcap=2.0, window_size=(3, 0))
    x = torch.randn(12, 2, 32, dtype=torch.float64)
    base = m(x)
    assert rel(base, reference_mha(m, x)) < TOL
    overridden = m(x, softcap=0.7, window_size=(1, 0))
    assert rel(overridden, reference_mha(m, x, softcap=0.7, window=(1, 0))) < TOL
    assert rel(overridden, base) > 1e3 * TOL
    # The override is for one call: the constructor's values stay.
    assert m.softcap == 2.0 and m.window_size == (3, 0)
    assert rel(m(x), base) < TOL


def test_softmax_type_override():
    m = make_mha(softmax_type="vanilla")
    x = torch.randn(4, 1, 32, dtype=torch.float64)
    off_by_one = m(x, softmax_type="off-by-one")
    assert rel(off_by_one, m(x)) > 1e3 * TOL
    with pytest.raises(dpa.InvalidArgumentError, match="softmax_type"):
        m(x, softmax_type="learnable")  # no parameter to learn


def test_query_key_layer_scaling_equals_the_unscaled_formula():
    x = torch.randn(10, 2, 32, dtype=torch.float64)
    plain = make_mha(softcap=3.0)
    scaled = make_mha(softcap=3.0, layer_number=6, apply_query_key_layer_scaling=True)
    scaled.load_state_dict(plain.state_dict())
    assert scaled.core_attention.layer_number == 6
    assert plain.core_attention.layer_number is None
    assert rel(scaled(x), plain(x)) < 1e-12
    with pytest.raises(dpa.InvalidArgumentError, match="layer_number"):
        MultiheadAttention(32, 4, apply_query_key_layer_scaling=True)


def test_rotary_embeddings_reach_q_and_k():
    m = make_mha()
    x = torch.randn(7, 2, 32, dtype=torch.float64)
    freqs = RotaryPositionEmbedding(8)(7).double()
    want = reference_mha(m, x, rotary=freqs)
    assert rel(want, reference_mha(m, x)) > 1e3 * TOL
    assert rel(m(x, rotary_pos_emb=freqs), want) < TOL


def test_rotary_thd_positions_restart_per_sequence():
    freqs = RotaryPositionEmbedding(4)(8)
    t = torch.randn(7, 2, 4)
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    packed = apply_rotary_pos_emb(t, freqs, "thd", cu)
    first = apply_rotary_pos_emb(t[:3].unsqueeze(1), freqs, "sbhd").squeeze(1)
    second = apply_rotary_pos_emb(t[3:].unsqueeze(1), freqs, "sbhd").squeeze(1)
    torch.testing.assert_close(packed, torch.cat([first, second]))


def test_positional_te_arguments_fail_loudly():
    m = make_mha()
    x = torch.randn(3, 1, 32, dtype=torch.float64)
    with pytest.raises(TypeError):
        m(x, None, None, None, None, True)  # TE's is_first_microbatch has no place here


# ---- TransformerLayer ----

def make_layer(**kwargs):
    args = dict(hidden_size=32, ffn_hidden_size=48, num_attention_heads=4, hidden_dropout=0.0,
                attention_dropout=0.0, params_dtype=torch.float64)
    args.update(kwargs)
    layer = TransformerLayer(**args)
    for attention in layer.attention_modules():
        attention.core_attention.backend = "cpu_exact"
    return layer


class CoreSpy:
    """Records what each core attention of a layer receives."""

    def __init__(self, layer, monkeypatch):
        self.calls = []
        for name, attention in (("self", layer.self_attention),
                                ("cross", layer.inter_attention)):
            if attention is None:
                continue
            core = attention.core_attention
            original = core.forward

            def spy(*args, _name=name, _core=core, _original=original, **kwargs):
                cap = kwargs.get("softcap")
                softmax = kwargs.get("softmax_type")
                self.calls.append((_name, _core.softcap if cap is None else cap,
                                   softmax or _core.softmax_type,
                                   kwargs.get("window_size") or _core.window_size))
                return _original(*args, **kwargs)

            monkeypatch.setattr(core, "forward", spy)


def test_decoder_caps_both_attentions_from_constructor_and_override(monkeypatch):
    layer = make_layer(layer_type="decoder", softcap=5.0, softmax_type="off-by-one",
                       window_size=(4, 0), enc_dec_attn_mask_type="no_mask")
    spy = CoreSpy(layer, monkeypatch)
    x = torch.randn(6, 2, 32, dtype=torch.float64)
    encoder = torch.randn(9, 2, 32, dtype=torch.float64)
    layer(x, encoder_output=encoder)
    assert spy.calls == [("self", 5.0, "off-by-one", (4, 0)),
                         ("cross", 5.0, "off-by-one", None)]
    spy.calls.clear()
    layer(x, encoder_output=encoder, softcap=0.25, softmax_type="vanilla", window_size=(2, 0),
          enc_dec_window_size=(3, 3))
    assert spy.calls == [("self", 0.25, "vanilla", (2, 0)), ("cross", 0.25, "vanilla", (3, 3))]


def test_decoder_features_change_the_output():
    layer = make_layer(layer_type="decoder", softcap=0.5, enc_dec_attn_mask_type="no_mask")
    x = torch.randn(6, 2, 32, dtype=torch.float64)
    encoder = torch.randn(9, 2, 32, dtype=torch.float64) * 4
    capped = layer(x, encoder_output=encoder)
    assert rel(layer(x, encoder_output=encoder, softcap=0.0), capped) > 1e-3
    with pytest.raises(dpa.InvalidArgumentError, match="encoder_output"):
        layer(x)


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
@pytest.mark.parametrize("post_norm", [False, True])
@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_encoder_layer_matches_its_parts(normalization, post_norm, activation):
    layer = make_layer(normalization=normalization, output_layernorm=post_norm,
                       activation=activation, softcap=3.0)
    x = torch.randn(8, 2, 32, dtype=torch.float64, requires_grad=True)
    attention = layer.self_attention
    mlp = layer._mlp
    if post_norm:
        h = layer.self_attention_norm(x + attention(x))
        want = layer.mlp_norm(h + mlp(h))
    else:
        h = x + attention(layer.self_attention_norm(x))
        want = h + mlp(layer.mlp_norm(h))
    got = layer(x)
    assert rel(got, want) < 1e-12
    got.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in layer.parameters())


def test_set_context_parallel_group_reaches_every_attention(monkeypatch):
    layer = make_layer(layer_type="decoder")
    seen = []
    for attention in layer.attention_modules():
        monkeypatch.setattr(attention.core_attention, "set_context_parallel_group",
                            lambda *args, _a=attention, **kw: seen.append((_a, args, kw)))
    layer.set_context_parallel_group("group", [0, 1], None, "a2a", cp_a2a_group_size=2)
    assert [s[0] for s in seen] == layer.attention_modules()
    assert all(s[1] == ("group", [0, 1], None, "a2a") and s[2] == {"cp_a2a_group_size": 2}
               for s in seen)
