"""Pooling a sequence into one vector: the mean over the real (unpadded) positions."""

from __future__ import annotations

import torch


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the real positions: hidden (B, T, D), mask (B, T) 1/True = real -> (B, D); 0 for an empty row.

    >>> mean_pool(torch.tensor([[[1.0], [3.0], [100.0]]]), torch.tensor([[1, 1, 0]])).tolist()
    [[2.0]]
    """
    if mask is None:
        return hidden.mean(dim=1)
    w = mask.to(hidden.dtype).unsqueeze(-1)  # (B, T, 1)
    return (hidden * w).sum(dim=1) / w.sum(dim=1).clamp(min=1.0)
