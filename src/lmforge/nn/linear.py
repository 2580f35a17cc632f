"""The linear map y = x Wᵀ + b, with a second way to compute the same product for the decoding engine's CPU steps.

``Linear`` is ``nn.Linear`` (same parameters, same state dict, the same ``F.linear`` call) unless the calling
thread is inside ``weights_first()``; there it computes y = (W xᵀ)ᵀ + b, the same product with the weight as the
left operand. For the 16 or more rows of a full decoding step MKL runs this form faster (SmolLM2-135M: 46 ms of
matrix products a step against 64 ms), and from 12 rows on it gives every row exactly the bits ``F.linear`` gives
it (measured on torch 2.13's CPU build on every shape of the model, 1 and 2 threads, with and without bias;
tests/test_engine.py checks every row count the engine steps).

    >>> layer = Linear(3, 2)
    >>> x = torch.randn(16, 3)
    >>> with weights_first():
    ...     y = layer(x)
    >>> bool(torch.allclose(y, layer(x)))
    True

The switch is a context variable, so it holds for the thread that set it only (a server's engine thread), and
costs a lookup per layer; a ``TorchFunctionMode`` doing the same intercepted every torch call of the step and
cost about 15% of a SmolLM2 step.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

WEIGHTS_FIRST = contextvars.ContextVar("lmforge_weights_first", default=False)


def weight_first_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x (..., D_in), weight (D_out, D_in) -> (W xᵀ)ᵀ + b, (..., D_out): ``F.linear``'s value, the weight first."""
    rows = x.reshape(-1, x.shape[-1]).t()  # (D_in, R)
    y = torch.mm(weight, rows) if bias is None else torch.addmm(bias[:, None], weight, rows)  # (D_out, R)
    return y.t().contiguous().view(*x.shape[:-1], weight.shape[0])


class Linear(nn.Linear):
    """``nn.Linear``, computed weight-first inside ``weights_first()`` (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_compiling() and WEIGHTS_FIRST.get():
            return weight_first_linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


@contextlib.contextmanager
def weights_first() -> Iterator[None]:
    """Inside the block, on this thread, every ``Linear`` computes (W xᵀ)ᵀ + b."""
    token = WEIGHTS_FIRST.set(True)
    try:
        yield
    finally:
        WEIGHTS_FIRST.reset(token)
