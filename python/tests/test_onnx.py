"""ONNX export (issue 19): DotProductAttention, MultiheadAttention and TransformerLayer export to
plain ONNX (no custom operators; Tanh for the cap, the sink as one more term of each row's
softmax sum, masks from index ranges, GQA), onnxruntime runs the graphs, and their outputs
match dpa's. A feature the graph cannot express fails the export, naming it."""

import pytest
import torch

import dpa
from dpa.torch import DotProductAttention, MultiheadAttention, TransformerLayer

onnxruntime = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")  # torch.onnx's exporter

TOL = 2e-5


def export(module, args):
    program = torch.onnx.export(module, args, dynamo=True, verbose=False)
    return program.model_proto


def run_onnx(proto, args):
    session = onnxruntime.InferenceSession(proto.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    tensors = [arg for arg in args if arg is not None]  # None inputs are not graph inputs
    feeds = {name: arg.detach().numpy() for name, arg in zip(names, tensors)}
    return torch.from_numpy(session.run(None, feeds)[0])


def ops(proto):
    return {(node.domain, node.op_type) for node in proto.graph.node}


def rel(a, b):
    return float((a - b).norm() / b.norm())


def check(module, args, expect_ops=()):
    module.eval()
    with torch.no_grad():
        want = module(*args)
    proto = export(module, args)
    used = ops(proto)
    assert all(domain in ("", "ai.onnx") for domain, _ in used), used  # standard ONNX only
    for op in expect_ops:
        assert ("", op) in used, (op, used)
    got = run_onnx(proto, args)
    assert rel(got, want) < TOL
    return want


def qkv(b=2, s=10, H=4, G=2, d=16, scale=2.0):
    return (torch.randn(b, s, H, d) * scale, torch.randn(b, s, G, d) * scale,
            torch.randn(b, s, G, d))


CASES = {
    "softcap_causal_gqa": (dict(softcap=3.0, attn_mask_type="causal"), ["Tanh"], "softcap"),
    "learnable_sink_window": (dict(softmax_type="learnable", attn_mask_type="causal",
                                   window_size=(3, 0)), [], "softmax_type"),
    "off_by_one_bottom_right": (dict(softmax_type="off-by-one",
                                     attn_mask_type="causal_bottom_right"), [], "softmax_type"),
    "window_no_mask": (dict(attn_mask_type="no_mask", window_size=(2, 2)), [], "window_size"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_dot_product_attention_round_trip(name):
    options, expect, feature = CASES[name]
    layer = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd", **options)
    if layer.softmax_offset is not None:
        with torch.no_grad():
            layer.softmax_offset.normal_(0, 3)
    args = qkv()
    want = check(layer, args, expect)
    # The feature moves the result: the export is not passing by dropping it.
    plain = {"softcap": dict(softcap=0.0), "softmax_type": dict(softmax_type="vanilla"),
             "window_size": dict(window_size=None)}[feature]
    base = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd",
                               **{**options, **plain}).eval()
    with torch.no_grad():
        assert rel(base(*args), want) > 100 * TOL


def test_padding_alibi_and_bias_round_trip():
    class Padded(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = DotProductAttention(4, 16, num_gqa_groups=2, qkv_format="bshd",
                                                 attn_mask_type="padding_causal", softcap=4.0)

        def forward(self, q, k, v, cu_seqlens, bias):
            return self.attention(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_kv=cu_seqlens,
                                  core_attention_bias_type="post_scale_bias",
                                  core_attention_bias=bias)

    q, k, v = qkv()
    cu = torch.tensor([0, 7, 17], dtype=torch.int32)
    bias = torch.randn(1, 4, 10, 10)
    check(Padded(), (q, k, v, cu, bias))

    class Alibi(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = DotProductAttention(4, 16, qkv_format="sbhd", attn_mask_type="causal")

        def forward(self, q, k, v):
            return self.attention(q, k, v, core_attention_bias_type="alibi")

    check(Alibi(), tuple(torch.randn(9, 2, 4, 16) for _ in range(3)))


def test_multihead_attention_and_transformer_layer_round_trip():
    torch.manual_seed(1)
    mha = MultiheadAttention(32, 4, num_gqa_groups=2, attention_dropout=0.0, softcap=2.0,
                             softmax_type="learnable", fuse_qkv_params=True)
    check(mha, (torch.randn(8, 2, 32),), ["Tanh"])
    decoder = TransformerLayer(32, 64, 4, hidden_dropout=0.0, attention_dropout=0.0,
                               layer_type="decoder", softcap=2.0, normalization="RMSNorm",
                               enc_dec_attn_mask_type="no_mask")
    check(decoder, (torch.randn(8, 2, 32), None, None, None, torch.randn(5, 2, 32)), ["Tanh"])


def test_features_the_graph_cannot_express_fail_the_export():
    layer = DotProductAttention(4, 16, qkv_format="bshd", attention_dropout=0.2)
    layer.train()
    args = tuple(torch.randn(1, 5, 4, 16) for _ in range(3))
    with pytest.raises(Exception) as failure:
        export(layer, args)
    chain, error = [], failure.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__
    assert any("dropout_p" in text and "ONNX" in text for text in chain), chain


def test_alias_names_reach_the_graph():
    """The library's aliases (off_by_one, post_scale_bias) export the feature they name."""
    class Aliased(torch.nn.Module):
        def forward(self, q, k, v, bias):
            return dpa.attention(q, k, v, causal=True, softmax_type="off_by_one", bias=bias,
                                 bias_type="post_scale_bias")

    q, k, v = qkv(s=6)
    bias = torch.randn(1, 4, 6, 6) * 3
    want = check(Aliased(), (q, k, v, bias))
    with torch.no_grad():
        plain = dpa.attention(q, k, v, causal=True)
    assert rel(plain, want) > 100 * TOL
