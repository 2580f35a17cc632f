"""Several LoRA adapters over one base, rows of different adapters in one batched call (S-LoRA, punica).

A served base carries N LoRA adapters (``lmforge serve --adapter NAME=DIR``) and each request names one, or none.
Merging an adapter into W (``nn.lora.merge_lora``) would make one model per adapter; here W stays the base's and
each ``nn.Linear`` that some adapter targets becomes a ``PerRowLoRA``, which adds to the base product the LoRA
update of each row's own adapter (nn/lora.py: y = W x + b + (alpha / r) B A x):

    y[b] = W x[b] + bias + scale[k] B[k] A[k] x[b]        k = rows[b], the adapter of row b (0: none)

    A      (N + 1, r_max, in)   adapter k's A (r_k, in) in A[k, :r_k], zeros after: a padded rank adds exact zeros
    B      (N + 1, out, r_max)  adapter k's B (out, r_k) in B[k, :, :r_k]
    scale  (N + 1,)             alpha_k / r_k
    index 0 is the base: zeros, so a base row gets the base product plus exact zeros (the base's bits); so does
    a row whose adapter does not target this layer

The rows' adapters are one (R,) tensor on the device, ``AdapterSelector.rows``, which the runner sets around each
prefill and step (runners/eager.py: the slots' adapters, kept on the device) and clears after: the layers read
it, so the model's code does not change and nothing here knows the engine. Outside a runner's call (an echo's
scoring pass, the attention page) ``rows`` is None and the layers compute the base alone. The update is two
gathered batched products, no loop over rows and no host sync, one shape whatever the mix of adapters:

    a = A[rows]  (R, r, in)      u = x a^T  (R, T, r) x scale[rows]      y += u B[rows]^T  (R, T, out)

Cost a row and a layer: 2 r_max (in + out) multiply-adds beside the base's in x out, and the gather of A and B
(R r_max (in + out) numbers). Layers no adapter targets stay plain ``nn.Linear``.

    >>> lin = nn.Linear(4, 3)
    >>> one = LoRAFactors("one", 2.0, {"": (torch.ones(1, 4), torch.ones(3, 1))})
    >>> layer = PerRowLoRA(lin, [one.layers[""]], [one.scale], AdapterSelector(["one"]))
    >>> with layer.selector.using(torch.tensor([0, 1])):
    ...     y = layer(torch.ones(2, 4))                    # row 0: the base; row 1: + 2 * (1 1 1)^T (1 1 1 1) x
    >>> (y - lin(torch.ones(2, 4))).round(decimals=4).tolist()
    [[0.0, 0.0, 0.0], [8.0, 8.0, 8.0]]
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn.lora import WrappedLinear


@dataclass
class LoRAFactors:
    """One adapter's LoRA: by the qualified name of each layer it targets, (A (r, in), B (out, r)); ``scale`` =
    alpha / r."""

    name: str
    scale: float
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]]


class AdapterSelector:
    """Which adapter each row of the model's next call takes: ``rows`` (R,) long on the model's device, index 0
    the base, k the ``names[k - 1]``; None: every row the base. One per model (``model.adapter_selector``)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)
        self.rows: torch.Tensor | None = None

    @contextlib.contextmanager
    def using(self, rows: torch.Tensor) -> Iterator[None]:
        """``rows`` for the calls inside the block, None again after."""
        self.rows = rows
        try:
            yield
        finally:
            self.rows = None


def selector_of(model: nn.Module) -> AdapterSelector | None:
    """The model's selector, when adapters were installed (``install_adapters``)."""
    return getattr(model, "adapter_selector", None)


class PerRowLoRA(WrappedLinear):
    """``base`` plus each row's own adapter's LoRA update (module docstring). ``factors[k]``: adapter k + 1's
    (A, B) for this layer, or None where it does not target it; ``scales[k]``: its alpha / r."""

    def __init__(self, base: nn.Linear, factors: Sequence[tuple[torch.Tensor, torch.Tensor] | None],
                 scales: Sequence[float], selector: AdapterSelector) -> None:
        super().__init__()
        self.base, self.selector = base, selector
        w = base.weight
        rank = max(f[0].shape[0] for f in factors if f is not None)
        n = len(factors) + 1
        a = torch.zeros(n, rank, base.in_features, dtype=w.dtype, device=w.device)  # (N + 1, r_max, in)
        b = torch.zeros(n, base.out_features, rank, dtype=w.dtype, device=w.device)  # (N + 1, out, r_max)
        scale = torch.zeros(n, dtype=w.dtype, device=w.device)  # (N + 1,)
        for k, (f, s) in enumerate(zip(factors, scales, strict=True), start=1):
            if f is not None:
                r = f[0].shape[0]
                a[k, :r], b[k, :, :r], scale[k] = f[0], f[1], s
        self.register_buffer("a", a, persistent=False)  # not the base's weights: never saved with it
        self.register_buffer("b", b, persistent=False)
        self.register_buffer("scale", scale, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (R, ..., in) -> (R, ..., out): the base product, plus row b's adapter's update."""
        y = self.base(x)
        rows = self.selector.rows
        if rows is None:
            return y
        x3 = x.reshape(rows.shape[0], -1, x.shape[-1])  # (R, T, in)
        u = torch.bmm(x3, self.a.index_select(0, rows).transpose(1, 2))  # (R, T, r_max)
        u = u * self.scale.index_select(0, rows)[:, None, None]
        return y + torch.bmm(u, self.b.index_select(0, rows).transpose(1, 2)).view(y.shape)  # (R, T, out)

    def extra_repr(self) -> str:
        return f"adapters={self.a.shape[0] - 1}, r_max={self.a.shape[1]}"


def install_adapters(model: nn.Module, adapters: Sequence[LoRAFactors]) -> AdapterSelector:
    """Each layer some adapter targets replaced by a ``PerRowLoRA`` holding every adapter's factors (adapter k
    is index k + 1), the others left as they are; the model's selector, also ``model.adapter_selector``."""
    selector = AdapterSelector([a.name for a in adapters])
    targets = dict.fromkeys(name for a in adapters for name in a.layers)  # in the adapters' order, once each
    for name in targets:
        layer = model.get_submodule(name) if name else model
        for a in adapters:
            check_factors(a, name, layer)
        parent, _, child = name.rpartition(".")
        replaced = PerRowLoRA(layer, [a.layers.get(name) for a in adapters], [a.scale for a in adapters], selector)
        setattr(model.get_submodule(parent) if parent else model, child, replaced)
    model.adapter_selector = selector
    return selector


def check_factors(adapter: LoRAFactors, name: str, layer: nn.Module) -> None:
    """An adapter's (A, B) for ``layer``: shapes (r, in) and (out, r) of this base's layer, or one line."""
    if name not in adapter.layers:
        return
    if not isinstance(layer, nn.Linear) or not layer.weight.is_floating_point():
        raise LmforgeError(f"--adapter {adapter.name}: {name} is a {type(layer).__name__} in the base, not a float "
                           "nn.Linear (adapters go over float weights: serve without --dtype int8 / int4)")
    a, b = adapter.layers[name]
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != layer.in_features or b.shape != (layer.out_features, a.shape[0]):
        raise LmforgeError(f"--adapter {adapter.name}: {name}'s A {tuple(a.shape)} and B {tuple(b.shape)} do not fit "
                           f"the base's layer ({layer.out_features} x {layer.in_features}): another base model")
