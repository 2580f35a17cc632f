"""ELMo's scalar mix (Peters et al. 2018, eq. 1): a learned weighted sum of all layers' hidden states.

    mix(h_0, ..., h_L) = gamma * sum_j softmax(s)_j * h_j

s (L + 1 scalars) starts at zero, so the mix starts as the plain average of the layers; gamma (one
scalar, starts at 1) rescales the result for the task. A frozen encoder with a scalar mix lets the task
choose which layers it reads (syntax sits lower than semantics) for L + 2 extra parameters.

    >>> mix = ScalarMix(3)
    >>> hs = [torch.full((1, 2, 4), float(v)) for v in (0, 3, 6)]   # three layers, (B, T, D)
    >>> mix(hs)[0, 0].tolist()                                       # softmax(0, 0, 0) = 1/3 each
    [3.0, 3.0, 3.0, 3.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.loss import IGNORE_INDEX
from lmforge.nn.pooling import mean_pool


class ScalarMix(nn.Module):
    """gamma * sum_j softmax(s)_j h_j over ``n_layers`` tensors of the same shape (B, T, D)."""

    def __init__(self, n_layers: int) -> None:
        super().__init__()
        self.scalars = nn.Parameter(torch.zeros(n_layers))  # s: (L + 1,)
        self.gamma = nn.Parameter(torch.ones(()))  # gamma: ()

    def weights(self) -> torch.Tensor:
        """softmax(s): how much each layer contributes, (L + 1,) summing to 1."""
        return torch.softmax(self.scalars, dim=0)

    def forward(self, hidden_states: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(hidden_states) != self.scalars.numel():
            raise ValueError(f"ScalarMix expects {self.scalars.numel()} layers, got {len(hidden_states)}")
        w = self.weights()
        stacked = torch.stack(tuple(hidden_states), dim=0)  # (L + 1, B, T, D)
        return self.gamma * torch.einsum("l,l...->...", w.to(stacked.dtype), stacked)  # (B, T, D)


class MixedFeatureModel(nn.Module):
    """A task model whose head reads ELMo's scalar mix of all the encoder's layers instead of the last.

    seq-cls pools the mix by a masked mean over real tokens; token-cls applies the head at every position.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.config, self.num_labels = model, model.config, model.num_labels
        self.mix = ScalarMix(model.config.n_layers + 1)
        self.token_level = not hasattr(model.encoder, "pooler") or "Token" in type(model).__name__

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None, **_: Any):
        out = self.model.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=True)
        h = self.mix(out.hidden_states)  # (B, T, D)
        if self.token_level:
            out.logits = self.model.head(h)  # (B, T, C)
        else:
            out.logits = self.model.head(mean_pool(h, attention_mask))  # (B, D) -> (B, C)
        if labels is not None:
            out.loss = F.cross_entropy(out.logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE_INDEX)
        return out
