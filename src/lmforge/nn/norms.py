"""Normalisation layers: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019).

    LayerNorm(x) = g ⊙ (x - mean(x)) / sqrt(var(x) + eps) + b
    RMSNorm(x)   = g ⊙ x / sqrt(mean(x²) + eps)

RMSNorm drops the centring and the shift: it only rescales each vector to unit root-mean-square. It costs
one reduction instead of two, and Zhang & Sennrich found the re-centring contributes little; LLaMA, Gemma
and the nanoGPT speedrun use it. ``make_norm`` builds either from a config string, so a model switches
between them with one field. The same RMSNorm, over each head's d_head features, is QK-norm
(``lmforge.nn.attention``).
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

Norm = Literal["layernorm", "rmsnorm"]
NORMS = ("layernorm", "rmsnorm")


class RMSNorm(nn.Module):
    """y = g ⊙ x / sqrt(mean(x²) + eps) over the last axis; ``affine=False`` leaves out the gain g."""

    def __init__(self, d: int, eps: float = 1e-5, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d)) if affine else None  # g: (d,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # torch's fused kernel computes exactly x * rsqrt(mean(x²) + eps) * g (accumulating in float32 for half
        # inputs); it needs g in x's dtype, which under autocast is bf16 or fp16 while g stays float32
        weight = self.weight.to(x.dtype) if self.weight is not None else None
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)  # (..., d)

    def extra_repr(self) -> str:
        d = self.weight.shape[0] if self.weight is not None else "-"
        return f"{d}, eps={self.eps}, affine={self.weight is not None}"


def make_norm(kind: str, d: int, eps: float = 1e-5, bias: bool = True) -> nn.Module:
    """'layernorm' (with a shift b unless ``bias=False``) or 'rmsnorm' (a gain only)."""
    if kind == "layernorm":
        return nn.LayerNorm(d, eps=eps, bias=bias)
    if kind == "rmsnorm":
        return RMSNorm(d, eps=eps)
    raise ValueError(f"unknown norm {kind!r}: choose {' or '.join(NORMS)}")
