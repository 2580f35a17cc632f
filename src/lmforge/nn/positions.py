"""Positional encodings: fixed sinusoids (Vaswani), learned embeddings (BERT, GPT-2) and rotary (RoFormer).

Attention by itself is permutation-equivariant: without positions, swapping two inputs swaps the two
outputs. Sinusoidal and learned encodings are *added* to the token embeddings; rotary encodings instead
rotate each query and key by an angle proportional to its position, so that q_m · k_n depends on m - n.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn


def sinusoidal_table(n_positions: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d)), shape (n_positions, d).

    Computed in float64 and equal to ``lmforge.reference.sinusoidal_positions``.
    """
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]  # (N, 1)
    two_i = torch.arange(0, d, 2, dtype=torch.float64)[None, :]  # (1, ceil(d/2))
    angle = pos / base ** (two_i / d)  # (N, ceil(d/2))
    pe = torch.zeros(n_positions, d, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d // 2])
    return pe


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings, added to the (scaled) token embeddings. No parameters."""

    def __init__(self, max_positions: int, d_model: int, base: float = 10000.0) -> None:
        super().__init__()
        self.register_buffer("table", sinusoidal_table(max_positions, d_model, base).float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        """positions: (..., T) integer indices -> (..., T, d_model)."""
        return self.table[positions]


class LearnedPositions(nn.Module):
    """One trained vector per position (BERT, GPT-2): an embedding table indexed by position."""

    def __init__(self, max_positions: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(max_positions, d_model)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        return self.embedding(positions)


class Angles(NamedTuple):
    """cos and sin of the rotation angles of some positions, (T, d_head) or (B, 1, T, d_head)."""

    cos: torch.Tensor
    sin: torch.Tensor


class RotaryEmbedding(nn.Module):
    """Rotary position embedding: rotate pairs of query/key features by position-dependent angles.

    Feature j of the first half is paired with feature j of the second half (the "rotate half" layout),
    and pair j turns by angle pos * base^(-2j/d_head). Rotations preserve norms, and
    rot(q, m) · rot(k, n) depends only on m - n: attention sees relative position.
    """

    def __init__(self, d_head: int, max_positions: int = 4096, base: float = 10000.0) -> None:
        super().__init__()
        if d_head % 2:
            raise ValueError(f"rotary embeddings need an even head width, got {d_head}")
        # Two tables. float64 for float64 inputs, so that a float64 model matches the reference to 1e-10; and for
        # every other dtype the angles as Llama-family models were trained with them (and as transformers computes
        # them): inv_freq and pos * inv_freq in float32. The two differ by ~1e-7 rad per position, which moves a
        # 30-layer model's logits by ~1e-4: matching a pretrained checkpoint means matching its arithmetic. The
        # float64 one is made at its first use (8 MiB for SmolLM2's 8,192 positions, 256 MiB for 131,072: most
        # models never run in float64).
        self.d_head, self.max_positions, self.base = d_head, max_positions, base
        cos, sin = self.angle_tables(torch.float32)
        self.register_buffer("cos32", cos, persistent=False)
        self.register_buffer("sin32", sin, persistent=False)
        self.exact: tuple[torch.Tensor, torch.Tensor] | None = None

    def angle_tables(self, dtype: torch.dtype, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of every position's angles, (N, d_head) each, computed in ``dtype``."""
        steps = torch.arange(0, self.d_head, 2, dtype=torch.int64, device=device).to(dtype) / self.d_head
        inv_freq = 1.0 / self.base ** steps  # (d/2,) base^(-2j/d)
        angle = torch.arange(self.max_positions, dtype=dtype, device=device)[:, None] * inv_freq  # (N, d/2)
        angle = torch.cat([angle, angle], dim=-1)  # (N, d)
        return angle.cos(), angle.sin()

    def tables(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) (N, d_head) for a model in ``dtype``: float64's own tables, the float32 ones otherwise."""
        if dtype != torch.float64:
            return self.cos32, self.sin32
        if self.exact is None or self.exact[0].device != self.cos32.device:
            self.exact = self.angle_tables(torch.float64, self.cos32.device)
        return self.exact

    @staticmethod
    def rotate_half(x: torch.Tensor) -> torch.Tensor:
        """[x1, x2] -> [-x2, x1] on the last axis, the 90-degree turn of each feature pair."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | Angles) -> torch.Tensor:
        """x: (B, H, T, d_head); positions: (T,) or (B, T), or their ``angles`` -> x rotated, same shape."""
        cos, sin = positions if isinstance(positions, Angles) else self.angles(positions, x.dtype)
        if cos.dtype != x.dtype:  # angles made for the model's dtype, x in autocast's
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return x * cos + self.rotate_half(x) * sin

    def angles(self, positions: torch.Tensor, dtype: torch.dtype) -> Angles:
        """cos and sin of the positions' angles in ``dtype``: (T, d), or (B, 1, T, d) for (B, T) positions.

        A model looks them up once a forward and hands them to every layer (the queries and keys of all L layers
        turn by the same angles): one lookup instead of 2L, which counts in a decoding step on CPU, where the
        small operations are a third of the time."""
        cos, sin = self.tables(dtype)
        cos, sin = cos[positions].to(dtype), sin[positions].to(dtype)  # (T, d) or (B, T, d)
        if cos.dim() == 3:
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, d): broadcast over heads
        return Angles(cos, sin)


def scale_embedding(d_model: int) -> float:
    """Vaswani et al. multiply token embeddings by sqrt(d_model) before adding sinusoids."""
    return math.sqrt(d_model)
