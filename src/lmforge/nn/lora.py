"""Parameter-efficient fine-tuning: LoRA (Hu et al. 2021) and bottleneck adapters (Houlsby et al. 2019).

Both wrap existing ``nn.Linear`` modules in place, so the model's code does not change:

    LoRA      y = W x + b + (alpha / r) * B A dropout(x)      A (r, in) random, B (out, r) zeros
    adapter   y = z + U act(D z),  z = W x + b                D (m, out) random, U (out, m) zeros

B = 0 and U = 0 at the start, so a freshly wrapped model computes exactly what the base model did.
Only A, B (or D, U) and the task head are trained. A LoRA update can be merged into W
(W <- W + (alpha / r) B A) for inference at zero extra cost, and unmerged again (W <- W - ...).

Which Linear layers are wrapped is chosen by name patterns (``fnmatch`` against the qualified name,
or a plain suffix). lmforge's attention stacks W_q, W_k, W_v into one ``in_proj`` (3D, D): one LoRA on
it is a rank-r update of the stacked matrix, i.e. q, k and v share the factor A and get their own rows
of B; ``out_proj`` is W_o. The parameter count for a (200 x 50) Linear at r = 5 (the seed's question):

    >>> lin = nn.Linear(50, 200, bias=False)                      # W: (200, 50) = 10,000 weights
    >>> lora = LoRALinear(lin, r=5, alpha=10)
    >>> lora.lora_A.numel() + lora.lora_B.numel()                 # A (5, 50) + B (200, 5)
    1250
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fnmatch import fnmatch

import torch
from torch import nn

from lmforge.nn.layers import activation_fn

LORA_TARGETS = ("*.in_proj", "*.out_proj")  # every attention's fused q/k/v and output projections
ADAPTER_TARGETS = ("*self_attn.out_proj", "*ffn.fc2")  # after attention and after the feed-forward


class WrappedLinear(nn.Module):
    """A module around an ``nn.Linear`` ``base`` that code reading a layer's ``weight`` / ``bias`` still finds
    (the base's): LoRA, adapters, several adapters per row (generation/adapters.py)."""

    base: nn.Linear

    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias


class LoRALinear(WrappedLinear):
    """``base`` (frozen) plus a trainable rank-r update (alpha / r) B A."""

    def __init__(self, base: nn.Linear, r: int = 8, alpha: float = 16.0, dropout: float = 0.0) -> None:
        super().__init__()
        if r < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {r}")
        self.base = base
        self.r, self.alpha, self.scaling = r, alpha, alpha / r
        w = base.weight
        self.lora_A = nn.Parameter(torch.empty(r, base.in_features, dtype=w.dtype, device=w.device))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, r, dtype=w.dtype, device=w.device))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear (and PEFT) initialise weights
        self.dropout = nn.Dropout(dropout)
        self.merged = False

    def delta_weight(self) -> torch.Tensor:
        """(alpha / r) B A: the (out, in) update LoRA adds to W."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # (..., out)
        if self.merged:
            return y
        return y + (self.dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling  # (..., in)->(..., r)->(..., out)

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A; the forward then skips the LoRA branch."""
        if not self.merged:
            self.base.weight += self.delta_weight().to(self.base.weight.dtype)
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W <- W - (alpha / r) B A: undo ``merge`` (exact up to float rounding)."""
        if self.merged:
            self.base.weight -= self.delta_weight().to(self.base.weight.dtype)
            self.merged = False

    def extra_repr(self) -> str:
        return f"r={self.r}, alpha={self.alpha}, merged={self.merged}"


class AdapterLinear(WrappedLinear):
    """``base`` (frozen) followed by a residual bottleneck: z + U act(D z), with U zero-initialised."""

    def __init__(self, base: nn.Linear, bottleneck: int = 64, activation: str = "gelu") -> None:
        super().__init__()
        self.base = base
        d = base.out_features
        w = base.weight
        self.down = nn.Linear(d, bottleneck, dtype=w.dtype, device=w.device)  # D: (m, d)
        self.up = nn.Linear(bottleneck, d, dtype=w.dtype, device=w.device)  # U: (d, m)
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.act = activation_fn(activation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.base(x)  # (..., d)
        return z + self.up(self.act(self.down(z)))  # (..., d) -> (..., m) -> (..., d)


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Does a module's qualified name match a pattern (fnmatch, or a plain ``.suffix``)?

    >>> matches("encoder.layers.0.self_attn.in_proj", ["*.in_proj"]), matches("head.classifier", ["in_proj"])
    (True, False)
    """
    return any(fnmatch(name, p) or name == p or name.endswith("." + p) for p in patterns)


def _replace(model: nn.Module, patterns: Sequence[str], wrap) -> list[str]:
    """Replace every nn.Linear whose name matches by ``wrap(linear)``; return the replaced names."""
    targets = [(name, m) for name, m in model.named_modules()
               if isinstance(m, nn.Linear) and matches(name, patterns)]
    if not targets:
        raise ValueError(f"no nn.Linear module matches {list(patterns)}")
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, wrap(module))
    return [name for name, _ in targets]


def inject_lora(model: nn.Module, r: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                targets: Sequence[str] = LORA_TARGETS) -> list[str]:
    """Wrap the matching Linear layers of ``model`` in ``LoRALinear``; returns their names."""
    return _replace(model, targets, lambda lin: LoRALinear(lin, r, alpha, dropout))


def inject_adapters(model: nn.Module, bottleneck: int = 64, targets: Sequence[str] = ADAPTER_TARGETS,
                    activation: str = "gelu") -> list[str]:
    """Wrap the matching Linear layers in ``AdapterLinear`` (default: attention output and FFN output)."""
    return _replace(model, targets, lambda lin: AdapterLinear(lin, bottleneck, activation))


def lora_layers(model: nn.Module) -> list[LoRALinear]:
    return [m for m in model.modules() if isinstance(m, LoRALinear)]


def merge_lora(model: nn.Module) -> None:
    """Fold every LoRA update into its base weight (zero-overhead inference)."""
    for m in lora_layers(model):
        m.merge()


def unmerge_lora(model: nn.Module) -> None:
    """Take every merged LoRA update back out of its base weight."""
    for m in lora_layers(model):
        m.unmerge()


def remove_wrappers(model: nn.Module) -> None:
    """Merge LoRA and put the plain nn.Linear layers back: a model with the base's structure.

    Adapters cannot be folded into W (a nonlinearity sits between), so a model with adapters is refused.
    """
    if any(isinstance(m, AdapterLinear) for m in model.modules()):
        raise ValueError("adapters cannot be merged into the base weights")
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            m.merge()
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name) if parent_name else model, child, m.base)


def is_delta_parameter(name: str) -> bool:
    """Parameters that LoRA / adapters add (``lora_A``, ``lora_B``, adapter ``down`` / ``up``)."""
    parts = name.split(".")
    return "lora_A" in parts or "lora_B" in parts or (len(parts) >= 2 and parts[-2] in ("down", "up"))


def mark_trainable(model: nn.Module, extra: Iterable[str] = ()) -> int:
    """Freeze everything except the LoRA / adapter parameters and those under the ``extra`` prefixes.

    Returns the number of trainable parameters.
    """
    prefixes = tuple(extra)
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_(is_delta_parameter(name) or (bool(prefixes) and name.startswith(prefixes)))
        n += p.numel() if p.requires_grad else 0
    return n


def trainable_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors only (the adapter-only checkpoint), detached, contiguous, on the CPU."""
    return {name: p.detach().contiguous().cpu() for name, p in model.named_parameters() if p.requires_grad}
