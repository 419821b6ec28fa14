"""Rotary position embeddings as TransformerEngine passes them (``rotary_pos_emb``).

``RotaryPositionEmbedding(dim)(max_seq_len)`` returns the angles ``freqs`` [s, 1, 1, dim] (the
inverse frequencies, each repeated for both halves of the rotated dims), and
``apply_rotary_pos_emb(t, freqs, tensor_format)`` rotates the first ``dim`` channels of
``t`` by them: ``t * cos + rotate_half(t) * sin`` (the non-interleaved form), the rest
unchanged. thd tensors take each row's position inside its own sequence (``cu_seqlens``).
"""

from typing import Optional

import torch
from torch import nn

from .. import errors


class RotaryPositionEmbedding(nn.Module):
    def __init__(self, dim: int, rotary_percent: float = 1.0,
                 seq_len_interpolation_factor: Optional[float] = None,
                 rotary_base: float = 10000.0):
        super().__init__()
        if not 0.0 < rotary_percent <= 1.0:
            raise errors.invalid("rotary_percent", f"must be in (0, 1], got {rotary_percent!r}")
        dim = int(dim * rotary_percent)
        if dim <= 0 or dim % 2:
            raise errors.invalid("dim", f"must give an even, positive rotated width, got {dim}")
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        inverse = 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inverse, persistent=False)

    def forward(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        positions = torch.arange(max_seq_len, device=self.inv_freq.device,
                                 dtype=torch.float32) + offset
        if self.seq_len_interpolation_factor is not None:
            positions = positions / self.seq_len_interpolation_factor
        freqs = torch.outer(positions, self.inv_freq)
        return torch.cat((freqs, freqs), dim=-1).view(max_seq_len, 1, 1, -1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _thd_positions(cu_seqlens: torch.Tensor, rows: int) -> torch.Tensor:
    """Each row's position inside its sequence (rows past the last sequence: 0)."""
    bounds = cu_seqlens.to(device="cpu", dtype=torch.int64)
    positions = torch.zeros(rows, dtype=torch.int64)
    for start, end in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        positions[start:end] = torch.arange(end - start)
    return positions


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, tensor_format: str = "sbhd",
                         cu_seqlens: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Rotates t ([s, b, h, d] sbhd, [b, s, h, d] bshd, [t, h, d] thd with ``cu_seqlens``) by
    freqs [s_max, 1, 1, dim] (dim <= d, even), in t's dtype."""
    if freqs.dim() != 4 or freqs.shape[1] != 1 or freqs.shape[2] != 1:
        raise errors.invalid("rotary_pos_emb", f"must be [s, 1, 1, dim], got {list(freqs.shape)}")
    dim = freqs.shape[-1]
    if dim > t.shape[-1] or dim % 2:
        raise errors.invalid("rotary_pos_emb", f"rotates {dim} channels of a head of "
                             f"{t.shape[-1]} (must be even and at most the head)")
    if tensor_format not in ("sbhd", "bshd", "thd"):
        raise errors.invalid("tensor_format", f"must be sbhd, bshd or thd, got {tensor_format!r}")
    if tensor_format == "thd":
        if cu_seqlens is None:
            raise errors.invalid("cu_seqlens", "is required to rotate a thd tensor")
        positions = _thd_positions(cu_seqlens, t.shape[0])
        longest = int(positions.max()) + 1 if positions.numel() else 0
    else:
        longest = t.shape[1] if tensor_format == "bshd" else t.shape[0]
    if freqs.shape[0] < longest:
        raise errors.invalid("rotary_pos_emb", f"covers {freqs.shape[0]} positions, the "
                             f"sequence has {longest}")
    if tensor_format == "sbhd":
        angles = freqs[: t.shape[0]]
    elif tensor_format == "bshd":
        angles = freqs[: t.shape[1]].transpose(0, 1)
    else:
        angles = freqs[positions.to(freqs.device)].squeeze(1)
    rotated, rest = t[..., :dim], t[..., dim:]
    cos, sin = angles.cos().to(t.dtype), angles.sin().to(t.dtype)
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, rest), dim=-1)
