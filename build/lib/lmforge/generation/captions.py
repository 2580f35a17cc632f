"""Captions of image-feature grids: ``generate`` run on a ``GridCaptioner`` (models/captioning.py).

The captioner is an encoder-decoder whose source is a flattened (X·Y, K) grid, so the same decoding loop
(greedy or beams, KV cache) writes its captions; the stop token is dropped.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.generation.decoding import generate


@torch.no_grad()
def caption(model: nn.Module, grid: torch.Tensor, max_new_tokens: int | None = None, beams: int = 1
            ) -> list[list[int]]:
    """Greedy (beams=1) or beam-search captions of a batch of grids (B, X, Y, K), stop token dropped."""
    grid = model.as_grid(grid)
    n = max_new_tokens or model.config.max_length - 1
    out = generate(model, grid.flatten(1), max_new_tokens=n, beams=beams)
    eos = model.config.eos_id
    return [[t for t in row if t != eos] for row in out.to_lists()]
