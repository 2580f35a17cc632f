"""Self-attention over an (X, Y) grid: the spatial transformer of seed 001 problem 5.

The seed replaces the time index t by two spatial indices (x, y):

    Query[k, x, y, U] = W^Q[k, U, J] h_in[x, y, J]          Key[k, x, y, U] = W^K[k, U, J] h_in[x, y, J]
    α[k, x1, y1, x2, y2] = softmax_{x2, y2} Query[k, x1, y1, U] Key[k, x2, y2, U]
    Value[k, x, y, I] = W^V[k, I, J] h_in[x, y, J]
    Out[k, x, y, I] = Σ_{x', y'} α[k, x, y, x', y'] Value[k, x', y', I]
    h_out[x, y, J] = Out[1, x, y, I]; ...; Out[K, x, y, I]

The softmax runs over all X·Y cells, so the layer is the ordinary one over a sequence of X·Y positions:
flatten the grid row by row (cell (x, y) -> position p = x·Y + y), run ``MultiHeadAttention`` (or a whole
``TransformerLayer``), and fold the result back to (X, Y). Like ``MultiHeadAttention`` it scales the scores
by 1/sqrt(U) (Vaswani et al.; seed 001 problem 6), which the seed's problem 5 leaves out, and it ends
with the output projection W_o. The parallel depth is O(log XY + log J): the sums over J and over the
X·Y cells are the only sequential parts (seed 001 problem 5(b)).

Attention alone is blind to where a cell is: permuting the cells permutes the outputs. Positions come
from ``sinusoidal_positions_2d``: the first half of the channels encode x, the second half y, each
with the 1-D sinusoids of Vaswani et al. at width D/2.

    >>> import torch
    >>> layer = SpatialSelfAttention(d_model=8, n_heads=2)
    >>> out, weights = layer(torch.randn(1, 3, 4, 8), need_weights=True)
    >>> tuple(out.shape), tuple(weights.shape), round(float(weights[0, 1, 2, 3].sum().detach()), 4)
    ((1, 3, 4, 8), (1, 2, 3, 4, 3, 4), 1.0)
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn.attention import MultiHeadAttention
from lmforge.nn.layers import Activation, NormPosition, TransformerLayer
from lmforge.nn.positions import sinusoidal_table


def sinusoidal_positions_2d(n_x: int, n_y: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """P[x, y, :D/2] = PE_{D/2}(x), P[x, y, D/2:] = PE_{D/2}(y): (X, Y, D) in float64, D even.

    PE_d is the 1-D table (``sinusoidal_table``): PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...).
    Each half keeps the 1-D property that P(x + a, y + b) is a fixed rotation of P(x, y), so
    P(x1, y1) · P(x2, y2) depends only on (x1 − x2, y1 − y2), and P(x, y) ≠ P(y, x) when x ≠ y.

    >>> p = sinusoidal_positions_2d(2, 3, 4)
    >>> p[1, 2].round(decimals=4).tolist()         # x = 1 in channels 0-1, y = 2 in channels 2-3
    [0.8415, 0.5403, 0.9093, -0.4161]
    """
    if d % 2:
        raise ValueError(f"2-D positions split the channels in two halves: d must be even, got {d}")
    half = d // 2
    px = sinusoidal_table(n_x, half, base)[:, None, :].expand(n_x, n_y, half)  # (X, Y, D/2): depends on x
    py = sinusoidal_table(n_y, half, base)[None, :, :].expand(n_x, n_y, half)  # (X, Y, D/2): depends on y
    return torch.cat([px, py], dim=-1)  # (X, Y, D)


def flatten_grid(h: torch.Tensor) -> torch.Tensor:
    """(B, X, Y, D) -> (B, X·Y, D), row-major: cell (x, y) becomes position x·Y + y."""
    b, n_x, n_y, d = h.shape
    return h.reshape(b, n_x * n_y, d)


def unflatten_grid(h: torch.Tensor, n_x: int, n_y: int) -> torch.Tensor:
    """(B, X·Y, ...) -> (B, X, Y, ...), the inverse of ``flatten_grid``."""
    return h.reshape(h.shape[0], n_x, n_y, *h.shape[2:])


def grid_weights(weights: torch.Tensor, n_x: int, n_y: int) -> torch.Tensor:
    """(B, H, X·Y, X·Y) attention weights -> α (B, H, X, Y, X, Y): [b, k, x1, y1, x2, y2]."""
    b, h = weights.shape[:2]
    return weights.reshape(b, h, n_x, n_y, n_x, n_y)


class SpatialSelfAttention(nn.Module):
    """``MultiHeadAttention`` over the cells of a grid; ``mask`` (B, X, Y) True = a cell that may be attended to."""

    def __init__(self, d_model: int, n_heads: int, d_qk: int | None = None, d_v: int | None = None,
                 bias: bool = True, dropout: float = 0.0) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(d_model, n_heads, d_qk=d_qk, d_v=d_v, bias=bias, dropout=dropout)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h: (B, X, Y, D) -> (h_out (B, X, Y, D), α (B, H, X, Y, X, Y) if ``need_weights`` else None)."""
        n_x, n_y = h.shape[1:3]
        keys = mask.reshape(h.shape[0], n_x * n_y) if mask is not None else None  # (B, X·Y)
        out, weights = self.attn(flatten_grid(h), key_padding_mask=keys, need_weights=need_weights)
        alpha = grid_weights(weights, n_x, n_y) if weights is not None else None
        return unflatten_grid(out, n_x, n_y), alpha


class Transformer2DLayer(nn.Module):
    """A ``TransformerLayer`` (spatial self-attention + feed-forward, residuals, post- or pre-LN) on a grid."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, norm_position: NormPosition = "post",
                 activation: Activation = "relu", dropout: float = 0.0, attention_dropout: float = 0.0,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.layer = TransformerLayer(d_model, n_heads, d_ff, norm_position=norm_position, activation=activation,
                                      dropout=dropout, attention_dropout=attention_dropout, eps=eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """h: (B, X, Y, D), mask: (B, X, Y) True = real cell -> ((B, X, Y, D), α (B, H, X, Y, X, Y) or None)."""
        n_x, n_y = h.shape[1:3]
        keys = mask.reshape(h.shape[0], n_x * n_y) if mask is not None else None  # (B, X·Y)
        out = self.layer(flatten_grid(h), key_padding_mask=keys, need_weights=need_weights)
        alpha = grid_weights(out.self_attention, n_x, n_y) if out.self_attention is not None else None
        return unflatten_grid(out.hidden, n_x, n_y), alpha


class Transformer2D(nn.Module):
    """h + P (2-D sinusoids), then ``n_layers`` Transformer2DLayers: a grid in, a grid of the same shape out."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, n_layers: int, positions: bool = True,
                 **layer_kwargs) -> None:
        super().__init__()
        self.positions = positions
        self.layers = nn.ModuleList(Transformer2DLayer(d_model, n_heads, d_ff, **layer_kwargs)
                                    for _ in range(n_layers))

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """h: (B, X, Y, D) -> (B, X, Y, D) and, when asked, one α (B, H, X, Y, X, Y) per layer."""
        if self.positions:
            h = h + sinusoidal_positions_2d(h.shape[1], h.shape[2], h.shape[3]).to(h)  # (B, X, Y, D)
        weights = []
        for layer in self.layers:
            h, alpha = layer(h, mask, need_weights)
            if alpha is not None:
                weights.append(alpha)
        return h, weights
