"""AdamW with two parameter groups, Muon for the hidden matrices, and the learning-rate schedule.

Weight decay pulls weights towards 0. It is meant for the matrices that mix features (Linear weights);
decaying a LayerNorm gain pulls it towards 0 instead of 1, decaying a bias or an embedding row that
is rarely seen only erases it. So, as in GPT-2, BERT and nanoGPT:

    decay     every parameter with 2+ dimensions that is not an embedding table
    no decay  biases, normalisation gains and shifts (1 dimension), nn.Embedding tables

A tied weight (GPT's LM head *is* the token embedding) is one tensor: it is listed once, as an embedding.

Muon (``train.optimizer: muon``; Jordan et al. 2024, the nanoGPT speedrun) updates each 2-D weight of the
Transformer layers with its momentum *orthogonalised*: the momentum matrix M = U S Vᵀ is replaced by an
approximation of U Vᵀ, computed by a few Newton-Schulz iterations (``newton_schulz``). Every direction
of the update then moves by the same amount, where plain momentum is dominated by its few largest
singular directions. It is only defined for matrices: the embeddings, the LM head and every gain and
bias stay with AdamW, inside the same optimizer object (one state to checkpoint)::

    M ← μ M + (1 - μ) G;   O = NS_5(G + μ (M - G))   (Nesterov);   W ← W (1 - lr_m λ) - lr_m √max(1, rows/cols) O

λ is ``train.muon_weight_decay`` (0 by default), not AdamW's ``train.weight_decay``: at Muon's larger learning
rate, 0.1 would shrink every hidden matrix by 0.2% a step.

A stacked projection ([W_q; W_k; W_v] in ``in_proj``, [W_g; W_u] in a SwiGLU ``fc1``) is orthogonalised
block by block, as if its matrices were separate.

The schedule is a function of the step alone (1 <= step <= max_steps), so resuming needs no state::

    warmup      lr(s) = lr * s / warmup_steps                                    s <= warmup_steps
    cosine      lr(s) = min_lr + (lr - min_lr) * (1 + cos(pi * p)) / 2           p = progress in [0, 1]
    linear      lr(s) = lr - (lr - min_lr) * p
    constant    lr(s) = lr
    with p = (s - warmup_steps) / (max_steps - warmup_steps)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn import FeedForward, MultiHeadAttention, TransformerLayer
from lmforge.train.config import TrainConfig

# Keller Jordan's quintic Newton-Schulz coefficients: a fast rise of small singular values rather than an
# exact limit, so the output's singular values land in about [0.7, 1.2] after 5 steps instead of exactly 1.
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


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


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """An approximation of U Vᵀ for g = U S Vᵀ (its orthogonal polar factor) by the iteration

        X_0 = g / ||g||_F             (every singular value now <= 1)
        X_{k+1} = a X_k + (b A + c A²) X_k,   A = X_k X_kᵀ

    Each step maps every singular value s to a s + b s³ + c s⁵ and leaves the singular vectors alone.
    Works on the wide orientation (rows <= cols) so that A is the smaller Gram matrix.
    """
    x = g if g.dtype in (torch.float32, torch.float64) else g.float()
    wide = x.shape[-2] <= x.shape[-1]
    x = x if wide else x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + eps)
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        gram = x @ x.mT  # (rows, rows)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return (x if wide else x.mT).to(g.dtype)


def orthogonalize(matrices: list[torch.Tensor], steps: int = 5) -> list[torch.Tensor]:
    """``newton_schulz`` of each matrix, scaled by sqrt(max(1, rows/cols)) so that a tall matrix's update
    has the RMS of a square one's. Matrices of one shape go through the iteration as one batch."""
    out: list[torch.Tensor | None] = [None] * len(matrices)
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, m in enumerate(matrices):
        by_shape.setdefault(tuple(m.shape), []).append(i)
    for (rows, cols), index in by_shape.items():
        ortho = newton_schulz(torch.stack([matrices[i] for i in index]), steps) * max(1.0, rows / cols) ** 0.5
        for i, o in zip(index, ortho, strict=True):
            out[i] = o
    return out  # type: ignore[return-value]


class Muon(torch.optim.Optimizer):
    """Muon for the groups marked ``muon: True``, AdamW for the others (see the module docstring).

    Group keys: lr, weight_decay; Muon groups: momentum, ns_steps, splits (row sizes of stacked blocks,
    or None); AdamW groups: betas, eps. ``lr_scale`` multiplies the schedule's lr (``set_lr``).
    """

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, betas: tuple[float, float] = (0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, ns_steps: int = 5) -> None:
        defaults = dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay,
                        ns_steps=ns_steps, muon=False, splits=None, lr_scale=1.0)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if group["muon"]:
                self._muon_update(params, group)
            else:
                for p in params:
                    self._adamw_update(p, group)
        return loss

    def _muon_update(self, params: list[torch.Tensor], group: dict) -> None:
        mu, lr = group["momentum"], group["lr"]
        blocks, counts = [], []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p)
            m = state["momentum_buffer"]
            m.lerp_(p.grad, 1 - mu)  # M ← μ M + (1 - μ) G
            update = p.grad.lerp(m, mu)  # Nesterov: look one momentum step ahead
            parts = update.split(group["splits"]) if group["splits"] else (update,)
            blocks.extend(parts)
            counts.append(len(parts))
        ortho = iter(orthogonalize(blocks, group["ns_steps"]))
        for p, n in zip(params, counts, strict=True):
            parts = [next(ortho) for _ in range(n)]
            p.mul_(1 - lr * group["weight_decay"])
            p.add_(torch.cat(parts) if n > 1 else parts[0], alpha=-lr)

    def _adamw_update(self, p: torch.Tensor, group: dict) -> None:
        g, (b1, b2) = p.grad, group["betas"]
        state = self.state[p]
        if "step" not in state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        denom = (v / (1 - b2 ** state["step"])).sqrt_().add_(group["eps"])
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1 ** state["step"]))


def hidden_matrices(model: nn.Module) -> dict[int, tuple[int, ...] | None]:
    """id -> row splits of every Linear weight inside a TransformerLayer: the matrices Muon takes.

    Splits give the row sizes of the blocks of a stacked weight ([W_q; W_k; W_v], [W_g; W_u]); None: one block.
    """
    splits: dict[int, tuple[int, ...] | None] = {}
    for layer in (m for m in model.modules() if isinstance(m, TransformerLayer)):
        for m in layer.modules():
            if isinstance(m, nn.Linear):
                splits.setdefault(id(m.weight), None)  # a stacked weight keeps the splits set by its owner
            if isinstance(m, MultiHeadAttention):
                q, k, v = m.widths()  # W_q, W_k, W_v rows (fewer for W_k, W_v with grouped-query attention)
                if m.cross:
                    splits[id(m.kv_proj.weight)] = (k, v)
                else:
                    splits[id(m.in_proj.weight)] = (q, k, v)
            if isinstance(m, FeedForward) and m.gated:
                half = m.fc1.weight.shape[0] // 2
                splits[id(m.fc1.weight)] = (half, half)
    return splits


def muon_param_groups(model: nn.Module, config: TrainConfig, no_decay: set[str] | None = None) -> list[dict]:
    """Muon groups (one per block layout) for the hidden matrices, then ``param_groups``'s two for the rest."""
    matrices = hidden_matrices(model)
    if not matrices:
        raise LmforgeError("train.optimizer=muon: the model has no Transformer layers (use adamw)")
    muon: dict[tuple[int, ...] | None, list[nn.Parameter]] = {}
    for p in model.parameters():
        if p.requires_grad and id(p) in matrices:
            muon.setdefault(matrices[id(p)], []).append(p)
    scale = config.muon_lr / config.lr
    groups = [{"params": ps, "muon": True, "splits": splits, "lr_scale": scale, "momentum": config.muon_momentum,
               "weight_decay": config.muon_weight_decay} for splits, ps in muon.items()]
    taken = {id(p) for ps in muon.values() for p in ps}
    for group in param_groups(model, config.weight_decay, no_decay):
        group["params"] = [p for p in group["params"] if id(p) not in taken]
        groups.append(group)
    return groups


def build_optimizer(
    model: nn.Module, config: TrainConfig, device: torch.device, no_decay: set[str] | None = None
) -> torch.optim.Optimizer:
    """AdamW over ``param_groups`` (the fused kernel where the device has one), or Muon + AdamW."""
    if config.optimizer == "muon":
        if config.fsdp:
            raise LmforgeError("train.optimizer=muon needs whole matrices: it does not run with train.fsdp=true")
        return Muon(muon_param_groups(model, config, no_decay), lr=config.lr, momentum=config.muon_momentum,
                    betas=config.betas, eps=config.eps)
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
    """Every group follows the schedule; a Muon group at its own scale (train.muon_lr / train.lr)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
