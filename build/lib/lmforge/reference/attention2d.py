"""Spatial self-attention of seed 001 problem 5, written index by index over (x, y) (NumPy, float64).

    Query[k, x, y, U] = W^Q[k, U, J] h_in[x, y, J]          Key[k, x, y, U] = W^K[k, U, J] h_in[x, y, J]
    α[k, x1, y1, x2, y2] = softmax_{x2, y2} s · Query[k, x1, y1, U] Key[k, x2, y2, U]
    Value[k, x, y, I] = W^V[k, I, J] h_in[x, y, J]
    Out[k, x, y, I] = Σ_{x', y'} α[k, x, y, x', y'] Value[k, x', y', I]
    h_out[x, y, J] = Out[1, x, y, I]; ...; Out[K, x, y, I]

The seed's equation has no scale (s = 1); Vaswani et al. and ``MultiHeadAttention`` use s = 1/sqrt(U).
Nothing here flattens the grid: the loops run over x, y, x', y' as the equations do.
"""

from __future__ import annotations

import numpy as np


def sinusoidal_positions_2d(n_x: int, n_y: int, d: int, base: float = 10000.0) -> np.ndarray:
    """P[x, y, c] (X, Y, D): channel c < D/2 is the 1-D sinusoid of x at width D/2, c ≥ D/2 that of y.

    With h = D/2 and c' = c (x half) or c − h (y half): P = sin(pos / base^(2⌊c'/2⌋/h)) for even c',
    cos(...) for odd c'.

    >>> sinusoidal_positions_2d(2, 3, 4)[1, 2].round(4).tolist()
    [0.8415, 0.5403, 0.9093, -0.4161]
    """
    if d % 2:
        raise ValueError(f"d must be even, got {d}")
    half = d // 2
    p = np.zeros((n_x, n_y, d))
    for x in range(n_x):
        for y in range(n_y):
            for c in range(d):
                pos, c_half = (x, c) if c < half else (y, c - half)
                angle = pos / base ** (2 * (c_half // 2) / half)
                p[x, y, c] = np.sin(angle) if c_half % 2 == 0 else np.cos(angle)
    return p


def spatial_self_attention(
    h_in: np.ndarray,
    w_q: np.ndarray,
    w_k: np.ndarray,
    w_v: np.ndarray,
    scale: float = 1.0,
    mask: np.ndarray | None = None,
    biases: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """h_out[x, y, K·I] and α[k, x1, y1, x2, y2] for one grid h_in[x, y, J].

    w_q, w_k: W^Q, W^K (K, U, J); w_v: W^V (K, I, J); scale: s (1 in the seed); mask: (X, Y) True = a cell
    that may be attended to (a query whose cells are all masked gets α = 0 and Out = 0);
    biases: optional (b_q (K, U), b_k (K, U), b_v (K, I)).

    >>> h = np.zeros((2, 2, 1)); h[0, 0, 0] = 1.0; w = np.ones((1, 1, 1))
    >>> out, alpha = spatial_self_attention(h, w, w, w)
    >>> alpha[0, 0, 0].round(4).tolist()          # cell (0, 0) prefers itself: e / (e + 3)
    [[0.4754, 0.1749], [0.1749, 0.1749]]
    """
    n_x, n_y, _ = h_in.shape
    n_k, n_u, _ = w_q.shape
    n_i = w_v.shape[1]
    b_q, b_k, b_v = biases if biases is not None else (np.zeros((n_k, n_u)), np.zeros((n_k, n_u)), np.zeros((n_k, n_i)))
    query = np.zeros((n_k, n_x, n_y, n_u))
    key = np.zeros((n_k, n_x, n_y, n_u))
    value = np.zeros((n_k, n_x, n_y, n_i))
    for k in range(n_k):
        for x in range(n_x):
            for y in range(n_y):
                query[k, x, y] = w_q[k] @ h_in[x, y] + b_q[k]
                key[k, x, y] = w_k[k] @ h_in[x, y] + b_k[k]
                value[k, x, y] = w_v[k] @ h_in[x, y] + b_v[k]
    alpha = np.zeros((n_k, n_x, n_y, n_x, n_y))
    out = np.zeros((n_k, n_x, n_y, n_i))
    for k in range(n_k):
        for x1 in range(n_x):
            for y1 in range(n_y):
                scores = np.full((n_x, n_y), -np.inf)
                for x2 in range(n_x):
                    for y2 in range(n_y):
                        if mask is None or mask[x2, y2]:
                            scores[x2, y2] = scale * float(query[k, x1, y1] @ key[k, x2, y2])
                if np.isneginf(scores).all():
                    continue  # nothing to attend to: α = 0, Out = 0
                e = np.exp(scores - scores.max())  # softmax over (x2, y2)
                alpha[k, x1, y1] = e / e.sum()
                for x2 in range(n_x):
                    for y2 in range(n_y):
                        out[k, x1, y1] += alpha[k, x1, y1, x2, y2] * value[k, x2, y2]
    h_out = np.concatenate([out[k] for k in range(n_k)], axis=-1)  # (X, Y, K·I): Out[1]; ...; Out[K]
    return h_out, alpha
