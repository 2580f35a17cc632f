"""Helpers shared by the models: weight initialisation and input checks (the losses are in lmforge.nn.loss)."""

from __future__ import annotations

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn.loss import IGNORE_INDEX, next_token_loss, token_loss

__all__ = ["IGNORE_INDEX", "check_ids", "check_length", "init_weights", "next_token_loss", "padding_mask",
           "token_loss"]

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
