"""The linear map y = x Wᵀ + b, with a second way to compute the same product for the decoding engine's CPU calls.

``Linear`` is ``nn.Linear`` (same parameters, same state dict, the same ``F.linear`` call) unless the calling
thread is inside ``packed_products()``; there a float32 CPU layer multiplies by a *packed* copy of its weight:
the weight reordered once into the blocked layout oneDNN's matrix kernels read (``torch.ops.mkldnn``), instead
of BLAS repacking panels of W at every call. Two things follow, both measured on torch 2.13's CPU build
(tests/test_engine.py checks them on every shape it relies on):

- a row's output has the same bits whatever the number of rows beside it (1 to 64) and the thread count (1 or
  2), which a plain ``F.linear`` does not give (MKL picks other kernels and thread splits by row count). The
  decoding engine rests on it: a request decoded alone and beside 15 others gets the same logits, and each
  step computes exactly its active rows.
- it is faster for the few rows of a decoding step: SmolLM2-135M's 211 products of a step, 2 threads: 35 ms
  for 1 row (F.linear 46-52), 33-36 ms for 4 (85-90), 58-88 ms for 16 (94-110); from about 256 rows (a long
  prefill) the two are even.

It differs from ``F.linear`` by float rounding only (another summation order: ~1e-6 relative). The packed copy
is made at a layer's first packed call and again whenever its weight changed since (an optimizer step, a
``load_state_dict``): the layer's weight memory twice over while it is served. Inference only: with autograd
recording, or for other dtypes and devices, the layer is ``F.linear``.

    >>> layer = Linear(3, 2)
    >>> x = torch.randn(16, 3)
    >>> with torch.no_grad(), packed_products():
    ...     y = layer(x)
    >>> bool(torch.allclose(y, layer(x), atol=1e-6))
    True

The switch is a context variable, so it holds for the thread that set it only (a server's engine thread), and
costs a lookup per layer. ``torch.compile`` cannot read one: a compiled decoding step (the engine's one-graph CPU
step, ``generation/calls.py``) instead sets each layer's ``packed`` attribute (``packed_attached``), and the graph
calls ``lmforge::packed_linear``, the same oneDNN product as an operator the compiler keeps as it is while it
fuses what lies between products.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import weakref
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

PACKED = contextvars.ContextVar("lmforge_packed_products", default=False)
# layer -> ((weight address, weight version), the weight, packed weight): kept beside the layer, not on it, so that
# copying, pickling and the state dict never see it, and it goes when the layer goes
_PACKS: weakref.WeakKeyDictionary[nn.Module, tuple[tuple[int, int], weakref.ref, torch.Tensor | None]] = \
    weakref.WeakKeyDictionary()
ROWS_HINT = 16  # the row count oneDNN's packed layout is chosen for (any count computes; measured best for 1-64)


@functools.cache
def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (every x86-64 and Arm CPU wheel has)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packs(weight: torch.Tensor) -> bool:
    """Whether a layer with this weight computes packed inside ``packed_products()``: float32 on the CPU."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and packing_available()


def packable(model: nn.Module) -> bool:
    """Whether every matrix product of a model is packed inside ``packed_products()``: each module holding a
    matrix is a float32 CPU ``Linear`` or an embedding (a lookup). Not so with unmerged LoRA or adapters, whose
    extra products are plain ones."""
    return all((isinstance(m, Linear) and packs(m.weight)) or isinstance(m, nn.Embedding)
               for m in model.modules() if any(p.dim() == 2 for p in m.parameters(recurse=False)))


def packed_weight(layer: nn.Linear) -> torch.Tensor | None:
    """The layer's weight in oneDNN's layout, made again when the weight has changed since the last call (another
    tensor, other storage or an in-place update); None for a weight that does not pack (``packs``)."""
    w = layer.weight
    key = (w.data_ptr(), -1 if w.is_inference() else w._version)
    held = _PACKS.get(layer)
    if held is None or held[0] != key or held[1]() is not w:
        held = key, weakref.ref(w), torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT) if packs(w) else None
        _PACKS[layer] = held
    return held[2]


@torch.library.custom_op("lmforge::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., in) times a weight packed by ``packed_weight`` (out, in), plus bias -> (..., out): oneDNN's product
    as one operator, which ``torch.compile`` calls as it is (no fake-tensor rule exists for oneDNN's own)."""
    return packed_product(x, packed, bias)


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN's product of x (..., in) and a packed weight. A lone row is computed as two (the row twice): on
    AVX-512 machines oneDNN takes another kernel for one row of some widths (1536 -> 576, SmolLM2's down
    projection), whose bits differ from the same row's among 2 to 64 rows (measured, torch 2.13)."""
    if x.numel() != x.shape[-1]:
        return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")
    pair = x.reshape(1, -1).expand(2, -1).contiguous()  # (2, in)
    return torch.ops.mkldnn._linear_pointwise.default(pair, packed, bias, "none", [], "")[:1].reshape(
        *x.shape[:-1], packed.shape[0])


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])


@contextlib.contextmanager
def packed_attached(layers: Sequence[Linear]) -> Iterator[None]:
    """Inside the block each of these layers holds its packed weight (made again if the weight changed) as its
    ``packed`` attribute, which a compiled inference call multiplies by; cleared after, so that nothing else ever
    sees it."""
    for layer in layers:
        layer.packed = packed_weight(layer)
    try:
        yield
    finally:
        for layer in layers:
            layer.__dict__.pop("packed", None)


class Linear(nn.Linear):
    """``nn.Linear``, computed from a packed weight inside ``packed_products()`` (see the module docstring)."""

    packed: torch.Tensor | None = None  # set by ``packed_attached``, read under torch.compile only

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            if self.packed is not None and not torch.is_grad_enabled():
                return packed_linear(x, self.packed, self.bias)
            return F.linear(x, self.weight, self.bias)
        if PACKED.get() and not torch.is_grad_enabled():
            packed = packed_weight(self)
            if packed is not None:
                return packed_product(x, packed, self.bias)
        return F.linear(x, self.weight, self.bias)


@contextlib.contextmanager
def packed_products() -> Iterator[None]:
    """Inside the block, on this thread, every float32 CPU ``Linear`` multiplies by its packed weight."""
    token = PACKED.set(True)
    try:
        yield
    finally:
        PACKED.reset(token)
