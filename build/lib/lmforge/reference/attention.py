"""Scaled dot-product and multi-head attention, exactly as written in the course (NumPy, float64).

Conventions (DESIGN.md): weights follow ``nn.Linear``, shape (out, in), so ``q = x @ w_q.T``.
With H heads, head h uses rows ``[h*d_k, (h+1)*d_k)`` of ``w_q`` and ``w_k`` and rows
``[h*d_v, (h+1)*d_v)`` of ``w_v``; ``w_o`` maps the concatenated heads back to the model width.
Masks are boolean, True = may attend. A query row whose keys are all masked attends to nothing:
its weights and its output are zero (rather than the NaN a naive softmax gives).
"""

from __future__ import annotations

import numpy as np


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtract the row maximum before exponentiating.

    >>> softmax(np.array([1.0, 2.0, 3.0])).round(4)
    array([0.09  , 0.2447, 0.6652])
    >>> softmax(np.array([1e4, 0.0])).round(4)      # no overflow
    array([1., 0.])
    >>> softmax(np.array([-np.inf, -np.inf]))       # nothing to attend to: all zeros
    array([0., 0.])
    """
    x = np.asarray(x, dtype=np.float64)
    peak = np.max(x, axis=axis, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    e = np.exp(x - peak)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V.

    q: (..., N_q, d_k), k: (..., N_k, d_k), v: (..., N_k, d_v), mask: broadcastable to (..., N_q, N_k).
    Returns (output (..., N_q, d_v), weights (..., N_q, N_k)).

    >>> q = k = np.eye(2); v = np.array([[1.0, 0.0], [0.0, 1.0]])
    >>> out, w = scaled_dot_product_attention(q, k, v)
    >>> w.round(3)
    array([[0.67, 0.33],
           [0.33, 0.67]])
    """
    d_k = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)  # (..., N_q, N_k)
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)
    return weights @ v, weights


def split_heads(x: np.ndarray, n_heads: int) -> np.ndarray:
    """(N, H*d) -> (H, N, d): head h takes columns [h*d, (h+1)*d), i.e. rows of the weight matrix.

    >>> split_heads(np.arange(8.0).reshape(2, 4), 2)[1]
    array([[2., 3.],
           [6., 7.]])
    """
    n, width = x.shape
    if width % n_heads:
        raise ValueError(f"width {width} is not divisible by n_heads={n_heads}")
    return x.reshape(n, n_heads, width // n_heads).transpose(1, 0, 2)


def multi_head_attention(
    x: np.ndarray,
    w_q: np.ndarray,
    w_k: np.ndarray,
    w_v: np.ndarray,
    w_o: np.ndarray,
    n_heads: int,
    mask: np.ndarray | None = None,
    memory: np.ndarray | None = None,
    biases: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention of seed 002: H scaled dot-product attentions, concatenated, then W_o.

    x: (N, D) queries' inputs; memory: (M, D) keys' and values' inputs for cross-attention (default x).
    w_q, w_k: (H*d_k, D); w_v: (H*d_v, D); w_o: (D_out, H*d_v); biases: optional (b_q, b_k, b_v, b_o).
    Returns (output (N, D_out), weights (H, N, M)).

    >>> rng = np.random.default_rng(0); x = rng.normal(size=(5, 6)); w = np.eye(6)
    >>> out, weights = multi_head_attention(x, w, w, w, w, n_heads=3)
    >>> out.shape, weights.shape, weights.sum(-1).round(6).tolist()[0]
    ((5, 6), (3, 5, 5), [1.0, 1.0, 1.0, 1.0, 1.0])
    """
    memory = x if memory is None else memory
    b_q, b_k, b_v, b_o = biases if biases is not None else (0.0, 0.0, 0.0, 0.0)
    q = split_heads(x @ w_q.T + b_q, n_heads)  # (H, N, d_k)
    k = split_heads(memory @ w_k.T + b_k, n_heads)  # (H, M, d_k)
    v = split_heads(memory @ w_v.T + b_v, n_heads)  # (H, M, d_v)
    heads, weights = scaled_dot_product_attention(q, k, v, mask)  # (H, N, d_v), (H, N, M)
    concat = heads.transpose(1, 0, 2).reshape(x.shape[0], -1)  # (N, H*d_v)
    return concat @ w_o.T + b_o, weights


def causal_mask(n: int) -> np.ndarray:
    """Lower-triangular boolean mask: position t may attend to positions <= t.

    >>> causal_mask(3).astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    return np.tril(np.ones((n, n), dtype=bool))
