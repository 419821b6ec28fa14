"""dpa.torch: nn.Module layers with TransformerEngine's names (docs/python.md)."""

from .dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention"]
