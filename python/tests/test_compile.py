"""torch.compile(fullgraph=True) traces a model that calls dpa with no graph break, and its
forward and backward equal eager mode's."""

import torch
from torch import nn

import dpa
from conftest import requires_cuda


class TinyAttentionModel(nn.Module):
    """Embedding -> qkv projection -> dpa (causal, softcap, learnable sinks) -> output."""

    def __init__(self, vocab=32, heads=2, head_dim=16, softcap=50.0, dropout=0.0):
        super().__init__()
        self.heads, self.head_dim, self.softcap, self.dropout = heads, head_dim, softcap, dropout
        width = heads * head_dim
        self.embed = nn.Embedding(vocab, width)
        self.qkv = nn.Linear(width, 3 * width)
        self.sinks = nn.Parameter(torch.randn(heads, dtype=torch.float32))
        self.out = nn.Linear(width, vocab)

    def forward(self, tokens, attention=None):
        x = self.embed(tokens)
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).unbind(2)
        o = (attention or dpa.attention)(q, k, v, causal=True, softcap=self.softcap,
                                         sinks=self.sinks, dropout_p=self.dropout)
        return self.out(o.reshape(b, s, -1))


def _check(device, dtype):
    torch.manual_seed(0)
    model = TinyAttentionModel().to(device=device, dtype=dtype)
    model.sinks.data = model.sinks.data.float()
    tokens = torch.randint(0, 32, (2, 24), device=device)
    eager_loss = model(tokens).float().square().mean()
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    loss = compiled(tokens).float().square().mean()
    loss.backward()
    torch.testing.assert_close(loss, eager_loss, rtol=1e-4, atol=1e-5)
    for p, g in zip(model.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-4)


def test_compile_fullgraph_cpu():
    _check("cpu", torch.float32)


def test_compile_with_dropout_has_no_graph_break():
    """The dropout seed is drawn inside the graph (torch.randint on the host)."""
    model = TinyAttentionModel(dropout=0.1)
    tokens = torch.randint(0, 32, (2, 24))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(tokens)
    assert explanation.graph_break_count == 0, explanation.break_reasons


@requires_cuda
def test_compile_fullgraph_cuda():
    _check("cuda", torch.float32)
