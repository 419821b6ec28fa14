"""dpa.torch: nn.Module layers with TransformerEngine's names (docs/python.md)."""

from .context_parallel import (dual_chunk_positions, release_context_parallel_groups,
                               shard_sequence, synchronize_context_parallel)
from .dot_product_attention import DotProductAttention
from .megatron import attention_from_config
from .multihead_attention import MultiheadAttention
from .rotary import RotaryPositionEmbedding, apply_rotary_pos_emb
from .transformer_layer import TransformerLayer

__all__ = [
    "DotProductAttention",
    "MultiheadAttention",
    "RotaryPositionEmbedding",
    "TransformerLayer",
    "apply_rotary_pos_emb",
    "attention_from_config",
    "dual_chunk_positions",
    "release_context_parallel_groups",
    "shard_sequence",
    "synchronize_context_parallel",
]
