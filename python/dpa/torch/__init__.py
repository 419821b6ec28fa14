"""dpa.torch: nn.Module layers with TransformerEngine's names (docs/python.md)."""

from .context_parallel import dual_chunk_positions, shard_sequence
from .dot_product_attention import DotProductAttention

__all__ = ["DotProductAttention", "dual_chunk_positions", "shard_sequence"]
