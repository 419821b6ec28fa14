"""Feature cases shared by the CPU and CUDA suites: each builds dpa's arguments and the
reference's for the same inputs, and names what the reference looks like without the feature
(so a test can show first that the feature moves the result)."""

from dataclasses import dataclass, field
from typing import Callable, Dict

import torch

import dpa
import reference


@dataclass
class Inputs:
    q: torch.Tensor  # bshd [b, sq, H, dqk] (sbhd when the case says so)
    k: torch.Tensor
    v: torch.Tensor
    extra: Dict[str, torch.Tensor] = field(default_factory=dict)  # sinks, bias, ...


@dataclass
class Case:
    name: str
    # (b, sq, skv, H, G, dqk, dv) -> extra tensors (sinks, bias, ...) in float64 / their dtype
    make_extra: Callable = lambda shape: {}
    dpa_args: Callable = lambda x: {}  # Inputs -> kwargs of dpa.attention
    ref_args: Callable = lambda x: {}  # Inputs -> kwargs of reference.attention
    shape: tuple = (2, 13, 19, 4, 2, 16, 16)
    qkv_format: str = "bshd"
    lengths: tuple = None  # (lengths_q, lengths_kv): padding rows beyond them are not compared
    differentiable: tuple = ()  # names in extra that get gradients


def _sinks(shape):
    return {"sinks": (5.0 * torch.randn(shape[3])).float()}


def _bias(batch_dims):
    def make(shape):
        b, sq, skv, H = shape[0], shape[1], shape[2], shape[3]
        dims = [b if "b" in batch_dims else 1, H if "h" in batch_dims else 1, sq, skv]
        return {"bias": 3.0 * torch.randn(dims, dtype=torch.float64)}
    return make


def _mask(shape):
    b, sq, skv = shape[0], shape[1], shape[2]
    mask = torch.rand(b, 1, sq, skv) < 0.3
    mask[..., 0] = False  # every row keeps a key
    return {"attn_mask": mask}


def _padding(shape):
    b = shape[0]
    lengths_q = torch.tensor([shape[1], shape[1] - 5][:b], dtype=torch.int32)
    lengths_kv = torch.tensor([shape[2] - 3, shape[2]][:b], dtype=torch.int32)
    cu = lambda n: torch.cat([torch.zeros(1, dtype=torch.int32), n.cumsum(0).int()])
    return {"cu_seqlens_q": cu(lengths_q), "cu_seqlens_kv": cu(lengths_kv),
            "lengths_q": lengths_q, "lengths_kv": lengths_kv}


SEED, OFFSET = 1234, 7


def _dropout_ref(x, p):
    b, sq, H = x.q.shape[0], x.q.shape[1], x.q.shape[2]
    return reference.dropout_keep(b, H, sq, x.k.shape[1], p, SEED, OFFSET)


CASES = [
    Case("plain"),
    Case("softcap", dpa_args=lambda x: {"softcap": 2.0}, ref_args=lambda x: {"softcap": 2.0}),
    Case("sinks", make_extra=_sinks, dpa_args=lambda x: {"sinks": x.extra["sinks"]},
         ref_args=lambda x: {"sink": x.extra["sinks"]}, differentiable=("sinks",)),
    Case("off_by_one", dpa_args=lambda x: {"softmax_type": "off-by-one"},
         ref_args=lambda x: {"sink": 0.0}, shape=(2, 13, 5, 4, 2, 16, 16)),
    Case("causal_bottom_right", dpa_args=lambda x: {"causal": True},
         ref_args=lambda x: {"window": (-1, 0)}),
    Case("causal_top_left", dpa_args=lambda x: {"mask_type": "causal"},
         ref_args=lambda x: {"window": (-1, 0), "bottom_right": False},
         shape=(2, 19, 13, 4, 2, 16, 16)),
    Case("window", dpa_args=lambda x: {"window_size": (4, 2)},
         ref_args=lambda x: {"window": (4, 2)}),
    Case("window_top_left",
         dpa_args=lambda x: {"window_size": (3, 1), "bottom_right_diagonal": False},
         ref_args=lambda x: {"window": (3, 1), "bottom_right": False}),
    Case("alibi", make_extra=lambda s: {"alibi": torch.rand(s[3]) * 0.5 + 0.1},
         dpa_args=lambda x: {"alibi_slopes": x.extra["alibi"]},
         ref_args=lambda x: {"alibi": x.extra["alibi"]}),
    Case("alibi_per_batch", make_extra=lambda s: {"alibi": torch.rand(s[0], s[3]) * 0.5 + 0.1},
         dpa_args=lambda x: {"alibi_slopes": x.extra["alibi"]},
         ref_args=lambda x: {"alibi": x.extra["alibi"]}),
    Case("bias_post_scale", make_extra=_bias("h"),
         dpa_args=lambda x: {"bias": x.extra["bias"], "bias_type": "post_scale"},
         ref_args=lambda x: {"bias": x.extra["bias"], "bias_type": "post_scale"},
         differentiable=("bias",)),
    Case("bias_pre_scale", make_extra=_bias("b"),
         dpa_args=lambda x: {"bias": x.extra["bias"], "bias_type": "pre_scale"},
         ref_args=lambda x: {"bias": x.extra["bias"], "bias_type": "pre_scale"},
         differentiable=("bias",)),
    Case("arbitrary_mask", make_extra=_mask,
         dpa_args=lambda x: {"mask_type": "arbitrary", "attn_mask": x.extra["attn_mask"]},
         ref_args=lambda x: {"mask": x.extra["attn_mask"]}),
    Case("padding", make_extra=_padding,
         dpa_args=lambda x: {"cu_seqlens_q": x.extra["cu_seqlens_q"],
                             "cu_seqlens_kv": x.extra["cu_seqlens_kv"]},
         ref_args=lambda x: {"lengths_q": x.extra["lengths_q"],
                             "lengths_kv": x.extra["lengths_kv"]}),
    Case("mqa", shape=(2, 13, 19, 4, 1, 16, 16)),
    Case("head_dims_differ", shape=(2, 13, 19, 4, 2, 24, 16)),
    Case("scale", dpa_args=lambda x: {"softmax_scale": 0.6},
         ref_args=lambda x: {"scale": 0.6}),
    Case("sbhd", qkv_format="sbhd", dpa_args=lambda x: {"softcap": 2.0},
         ref_args=lambda x: {"softcap": 2.0}),
    Case("dropout", dpa_args=lambda x: {"dropout_p": 0.25, "seed": SEED, "offset": OFFSET},
         ref_args=lambda x: {"dropout": _dropout_ref(x, 0.25)}),
    Case("gemma2_gpt_oss_mix", make_extra=_sinks,
         dpa_args=lambda x: {"causal": True, "window_size": (6, 0), "softcap": 2.0,
                             "sinks": x.extra["sinks"], "dropout_p": 0.1, "seed": SEED,
                             "offset": OFFSET},
         ref_args=lambda x: {"window": (6, 0), "softcap": 2.0, "sink": x.extra["sinks"],
                             "dropout": _dropout_ref(x, 0.1)},
         differentiable=("sinks",)),
]


def make_inputs(case: Case, dtype=torch.float64, device="cpu", magnitude=1.5):
    """Logits of O(1-10) (DESIGN.md §9: inputs that do not hide the feature)."""
    b, sq, skv, H, G, dqk, dv = case.shape
    q = magnitude * torch.randn(b, sq, H, dqk, dtype=torch.float64)
    k = magnitude * torch.randn(b, skv, G, dqk, dtype=torch.float64)
    v = torch.randn(b, skv, G, dv, dtype=torch.float64)
    extra = case.make_extra(case.shape)
    if case.qkv_format == "sbhd":
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    q, k, v = (t.to(dtype=dtype, device=device) for t in (q, k, v))
    extra = {name: (t.to(device) if name not in ("lengths_q", "lengths_kv") else t)
             for name, t in extra.items()}
    if "bias" in extra:
        extra["bias"] = extra["bias"].to(dtype)
    return Inputs(q, k, v, extra)


def to_reference_layout(t, qkv_format):
    """bshd / sbhd -> [b, H, s, d] float64 on the host."""
    t = t.detach().double().cpu()
    return t.permute(0, 2, 1, 3) if qkv_format == "bshd" else t.permute(1, 2, 0, 3)


def reference_result(case: Case, x: Inputs, with_feature=True):
    """(o in dpa's layout, lse, grads by name) from the float64 reference, with the loss
    sum(o * w) for a fixed w."""
    leaves = {
        "q": to_reference_layout(x.q, case.qkv_format).requires_grad_(),
        "k": to_reference_layout(x.k, case.qkv_format).requires_grad_(),
        "v": to_reference_layout(x.v, case.qkv_format).requires_grad_(),
    }
    args = case.ref_args(x) if with_feature else {}
    for name in case.differentiable:
        source = "sink" if name == "sinks" else name
        if source in args:
            leaves[name] = args[source].detach().double().cpu().requires_grad_()
            args[source] = leaves[name]
    args = {key: (value.cpu() if isinstance(value, torch.Tensor) else value)
            for key, value in args.items()}
    o, lse = reference.attention(leaves["q"], leaves["k"], leaves["v"], **args)
    weight = loss_weight(o.shape)
    (o * weight).sum().backward()
    grads = {name: to_dpa_layout(leaf.grad, case.qkv_format) if name in ("q", "k", "v")
             else leaf.grad for name, leaf in leaves.items()}
    return to_dpa_layout(o.detach(), case.qkv_format), lse.detach(), grads


def to_dpa_layout(t, qkv_format):
    """[b, H, s, d] -> bshd / sbhd."""
    return t.permute(0, 2, 1, 3) if qkv_format == "bshd" else t.permute(2, 0, 1, 3)


def loss_weight(shape):
    generator = torch.Generator().manual_seed(99)
    return torch.randn(shape, dtype=torch.float64, generator=generator)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    assert torch.isfinite(a).all(), "NaN or inf in the result"
    return float((a - b).norm() / b.norm().clamp_min(1e-300))


def run_dpa(case: Case, x: Inputs, backend: str):
    """o, lse and the gradients of sum(o * w) by name, through dpa.attention on `backend`
    (the same w as reference_result, in x's layout, device and dtype)."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (x.q, x.k, x.v))
    args = case.dpa_args(x)
    leaves = {"q": q, "k": k, "v": v}
    for name in case.differentiable:
        leaves[name] = args[name].detach().clone().requires_grad_()
        args[name] = leaves[name]
    o, lse = dpa.attention(q, k, v, qkv_format=case.qkv_format, return_lse=True,
                           backend=backend, **args)
    bhsd = (o.shape[0], o.shape[2], o.shape[1], o.shape[3]) if case.qkv_format == "bshd" else \
        (o.shape[1], o.shape[2], o.shape[0], o.shape[3])
    weight = to_dpa_layout(loss_weight(bhsd), case.qkv_format).to(o.device, o.dtype)
    # The cast before the sum keeps fp16 sums finite; its gradient is exact (ones).
    (o * weight).float().sum().backward()
    return o.detach(), lse.detach(), {name: leaf.grad for name, leaf in leaves.items()}
