"""AdamW with two parameter groups, and the learning-rate schedule.

Weight decay pulls weights towards 0. It is meant for the matrices that mix features (Linear weights);
decaying a LayerNorm gain pulls it towards 0 instead of 1, decaying a bias or an embedding row that
is rarely seen only erases it. So, as in GPT-2, BERT and nanoGPT:

    decay     every parameter with 2+ dimensions that is not an embedding table
    no decay  biases, normalisation gains and shifts (1 dimension), nn.Embedding tables

A tied weight (GPT's LM head *is* the token embedding) is one tensor: it is listed once, as an embedding.

The schedule is a function of the step alone (1 <= step <= max_steps), so resuming needs no state::

    warmup      lr(s) = lr * s / warmup_steps                                    s <= warmup_steps
    cosine      lr(s) = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2           p = progress in [0, 1]
    linear      lr(s) = lr - (lr - min_lr) * p
    constant    lr(s) = lr
    with p = (s - warmup_steps) / (max_steps - warmup_steps)
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.train.config import TrainConfig


def no_decay_names(model: nn.Module) -> set[str]:
    """Names of the parameters that are not decayed: 1-dimensional ones and nn.Embedding tables.

    Call it on the plain model: inside FSDP the parameters are flattened shards and their shapes lie.
    """
    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return {name for name, p in model.named_parameters(remove_duplicate=False)
            if p.dim() < 2 or id(p) in embedding_ids}


WRAPPER_PARTS = {"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"}


def clean_name(name: str) -> str:
    """A parameter's name without what DDP (a leading ``module.``), FSDP and torch.compile insert.

    >>> clean_name("module._orig_mod.fc.weight"), clean_name("_fsdp_wrapped_module.layers.0.module.w")
    ('fc.weight', 'layers.0.module.w')
    """
    parts = [p for p in name.split(".") if p not in WRAPPER_PARTS]
    while parts and parts[0] == "module":
        parts = [p for p in parts[1:] if p not in WRAPPER_PARTS]
    return ".".join(parts)


def param_groups(model: nn.Module, weight_decay: float, no_decay: set[str] | None = None) -> list[dict]:
    """Split the trainable parameters into a decayed group and a not-decayed group (see the module doc).

    no_decay: names from ``no_decay_names`` of the unwrapped model (default: computed from ``model``).

    >>> groups = param_groups(nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4)), 0.1)
    >>> [(g["weight_decay"], [tuple(p.shape) for p in g["params"]]) for g in groups]
    [(0.1, [(4, 4)]), (0.0, [(10, 4), (4,), (4,), (4,)])]
    """
    no_decay = no_decay_names(model) if no_decay is None else no_decay
    decay, keep = [], []
    for name, p in model.named_parameters():  # a tied tensor is listed once, under its first name
        if p.requires_grad:
            (keep if clean_name(name) in no_decay else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": keep, "weight_decay": 0.0},
    ]


def build_optimizer(
    model: nn.Module, config: TrainConfig, device: torch.device, no_decay: set[str] | None = None
) -> torch.optim.AdamW:
    """AdamW over ``param_groups``; the fused kernel where the device has one (CPU and CUDA do)."""
    groups = param_groups(model, config.weight_decay, no_decay)
    kwargs = dict(lr=config.lr, betas=config.betas, eps=config.eps)
    try:
        return torch.optim.AdamW(groups, fused=device.type in ("cpu", "cuda"), **kwargs)
    except (RuntimeError, TypeError):  # an older torch or a device without the fused kernel
        return torch.optim.AdamW(groups, **kwargs)


def lr_at(step: int, config: TrainConfig) -> float:
    """The learning rate of update ``step`` (1-based): linear warmup, then the chosen decay."""
    if config.warmup_steps and step <= config.warmup_steps:
        return config.lr * step / config.warmup_steps
    if config.schedule == "constant" or config.max_steps <= config.warmup_steps:
        return config.lr
    progress = min(1.0, (step - config.warmup_steps) / (config.max_steps - config.warmup_steps))
    if config.schedule == "cosine":
        return config.min_lr + (config.lr - config.min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return config.lr - (config.lr - config.min_lr) * progress  # linear


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
