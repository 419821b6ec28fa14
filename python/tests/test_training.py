"""A training run of a small attention model (causal, softcap 50, learnable sinks) compiled
with torch.compile(fullgraph=True) on dpa, step for step against the same model on a
pure-PyTorch attention: the losses must agree at every step."""

import pytest
import torch

from conftest import CUDA
from test_compile import TinyAttentionModel


def torch_attention(q, k, v, causal, softcap, sinks, dropout_p=0.0):
    """Pure PyTorch, in fp32: bshd in, bshd out (FlashAttention's bottom-right causal)."""
    dtype = v.dtype
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = softcap * torch.tanh(s / softcap)
    sq, skv = s.shape[-2], s.shape[-1]
    visible = torch.ones(sq, skv, dtype=torch.bool, device=s.device).tril(skv - sq)
    s = s.masked_fill(~visible, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1).expand(s.shape[0], -1, sq, 1)
    p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    return (p @ v).transpose(1, 2).to(dtype)


def train(model, attention, tokens, steps, compile_model):
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    step_fn = model
    if compile_model:
        torch._dynamo.reset()
        step_fn = torch.compile(model, fullgraph=True)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        logits = step_fn(tokens, attention) if attention else step_fn(tokens)
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1),
                                                 tokens.roll(-1, 1).flatten())
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return losses


@pytest.mark.parametrize("device,dtype,tolerance", [
    ("cpu", torch.float32, 1e-4),
    pytest.param("cuda", torch.bfloat16, 2e-2,
                 marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA device")),
])
def test_training_losses_match_the_pytorch_reference(device, dtype, tolerance):
    torch.manual_seed(0)
    head_dim = 64 if device == "cuda" else 16
    reference = TinyAttentionModel(head_dim=head_dim).to(device)
    ours = TinyAttentionModel(head_dim=head_dim).to(device)
    ours.load_state_dict(reference.state_dict())
    for model in (reference, ours):
        model.to(dtype)
        model.sinks.data = model.sinks.data.float()
    tokens = torch.randint(0, 32, (4, 64), device=device)
    steps = 8
    expected = train(reference, lambda q, k, v, **kw: torch_attention(q, k, v, **kw), tokens,
                     steps, compile_model=False)
    got = train(ours, None, tokens, steps, compile_model=True)
    assert expected[-1] < expected[0], "the run must learn something"
    for step, (a, b) in enumerate(zip(got, expected)):
        assert abs(a - b) <= tolerance * abs(b), f"step {step}: dpa {a}, reference {b}"
