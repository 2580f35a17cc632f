"""Helpers shared by the three models: weight initialisation, input checks, the shifted LM loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError

IGNORE_INDEX = -100


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """BERT/GPT-2 initialisation: Linear and Embedding weights ~ N(0, std), biases 0, LayerNorm (1, 0)."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=std)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=std)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def check_length(length: int, max_positions: int, what: str = "input") -> None:
    """Learned/sinusoidal position tables have max_positions rows: longer inputs cannot be embedded."""
    if length > max_positions:
        raise LmforgeError(
            f"{what} has {length} positions but the model's max_positions is {max_positions}; "
            f"truncate it to {max_positions} tokens"
        )


def check_ids(input_ids: torch.Tensor, name: str = "input_ids") -> None:
    if input_ids.dim() != 2:
        raise LmforgeError(f"{name} must have shape (batch, length), got {tuple(input_ids.shape)}")


def padding_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """(B, S) 1/True = real token -> boolean key-padding mask (True = may attend), or None."""
    if mask is None:
        return None
    return mask if mask.dtype == torch.bool else mask != 0


def token_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100. logits (..., V), labels (...).

    With label smoothing ε (Szegedy et al. 2016; Vaswani et al. §5.4 use ε = 0.1) the target is
    (1 - ε) on the label plus ε / V spread over the whole vocabulary.
    """
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Causal LM loss: the prediction at position t is scored against the token at t + 1.

    logits (B, T, V), labels (B, T) (usually the input ids, with -100 where no loss is wanted).
    """
    # Shift the labels left rather than the logits right: the same loss without copying (B, T - 1, V) logits.
    return token_loss(logits, F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX))
