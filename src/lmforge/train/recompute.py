"""Activation checkpointing (Chen et al. 2016, "Training deep nets with sublinear memory cost").

Backpropagation keeps every layer's intermediate tensors from the forward pass until the backward pass reads
them: for SmolLM2 (30 layers) about 43 KB per token per layer, 10.6 GB for a batch of 16 rows of 512 tokens.
With ``recompute_layers(model)`` each layer keeps its input only (D floats a token) and runs again, under the
same random state (dropout draws the same masks), when the backward pass reaches it: one more forward pass per
step for memory that no longer grows with the depth.

    recompute_layers(model)          # model.layers: an nn.ModuleList of layers
    model(**batch).loss.backward()   # the same loss and gradients (tests/test_memory.py)

Measured on SmolLM2-135M, LoRA, one update of 16 rows x 512 tokens, 2 cores (docs/finetuning.md#memory): in 4
passes of 4 rows, 28 s and 5.2 GB without, 40 s and 2.5 GB with it. So it pays only where even one row's
activations do not fit (long ``--max-len``); ``lmforge finetune --task chat --activation-checkpointing``.
The module tree is left as it is (the layers' forward is wrapped in place), so state dicts and saved weights
keep their names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def recomputed(forward: Callable[..., Any], module: nn.Module) -> Callable[..., Any]:
    """``forward``, run under ``torch.utils.checkpoint`` when it builds a graph (training, gradients on)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if module.training and torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)  # evaluation and decoding: nothing to keep, nothing to recompute

    run.recomputed = True  # type: ignore[attr-defined]
    return run


def recompute_layers(model: nn.Module) -> int:
    """Make each of ``model.layers`` recompute its activations in the backward pass; returns how many layers."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"{type(model).__name__} has no .layers ModuleList to recompute")
    for layer in layers:
        if not getattr(layer.forward, "recomputed", False):  # once only
            layer.forward = recomputed(layer.forward, layer)
    return len(layers)
