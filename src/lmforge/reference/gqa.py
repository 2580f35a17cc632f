"""Grouped-query attention (Ainslie et al. 2023) in NumPy float64, written as the equation.

H query heads share H_kv key/value heads: query head h reads key/value group

    g(h) = floor(h / (H / H_kv))
    head_h = softmax(q_h k_g(h)ᵀ / sqrt(d)) v_g(h)
    GQA(X) = concat(head_1, ..., head_H) W_oᵀ

with q_h = X W_q^hᵀ (rows [h d, (h+1) d) of W_q, H d rows in all) and k_g = X W_k^gᵀ, v_g = X W_v^gᵀ
(rows [g d, (g+1) d) of W_k and W_v, H_kv d rows each). H_kv = H is multi-head attention, H_kv = 1 is
multi-query attention (Shazeer 2019). A loop over the query heads, on purpose: the torch module shares the
key/value heads by broadcasting, and the two are compared to 1e-10.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference.attention import scaled_dot_product_attention, split_heads


def group_of(h: int, n_heads: int, n_kv_heads: int) -> int:
    """The key/value head that query head h reads: floor(h / (H / H_kv)).

    >>> [group_of(h, 9, 3) for h in range(9)]
    [0, 0, 0, 1, 1, 1, 2, 2, 2]
    """
    if n_heads % n_kv_heads:
        raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
    return h // (n_heads // n_kv_heads)


def grouped_heads(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """head_h = Attention(q_h, k_g(h), v_g(h)) for every query head h.

    q: (H, N, d), k: (H_kv, M, d), v: (H_kv, M, d_v), mask: broadcastable to (N, M).
    Returns (heads (H, N, d_v), weights (H, N, M)): one row of weights per query head.
    """
    n_heads, n_kv_heads = q.shape[0], k.shape[0]
    heads, weights = [], []
    for h in range(n_heads):
        g = group_of(h, n_heads, n_kv_heads)
        out, w = scaled_dot_product_attention(q[h], k[g], v[g], mask)  # (N, d_v), (N, M)
        heads.append(out)
        weights.append(w)
    return np.stack(heads), np.stack(weights)


def grouped_query_attention(
    x: np.ndarray,
    w_q: np.ndarray,
    w_k: np.ndarray,
    w_v: np.ndarray,
    w_o: np.ndarray,
    n_heads: int,
    n_kv_heads: int,
    mask: np.ndarray | None = None,
    biases: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """GQA self-attention of x (N, D): w_q (H d, D), w_k and w_v (H_kv d, D), w_o (D, H d).

    Returns (output (N, D), weights (H, N, N)).

    >>> rng = np.random.default_rng(0); x = rng.normal(size=(4, 6))
    >>> w_q, w_kv, w_o = rng.normal(size=(6, 6)), rng.normal(size=(2, 6)), rng.normal(size=(6, 6))
    >>> out, weights = grouped_query_attention(x, w_q, w_kv, w_kv, w_o, n_heads=3, n_kv_heads=1)
    >>> out.shape, weights.shape
    ((4, 6), (3, 4, 4))
    """
    b_q, b_k, b_v, b_o = biases if biases is not None else (0.0, 0.0, 0.0, 0.0)
    q = split_heads(x @ w_q.T + b_q, n_heads)  # (H, N, d)
    k = split_heads(x @ w_k.T + b_k, n_kv_heads)  # (H_kv, N, d)
    v = split_heads(x @ w_v.T + b_v, n_kv_heads)  # (H_kv, N, d_v)
    heads, weights = grouped_heads(q, k, v, mask)  # (H, N, d_v), (H, N, N)
    concat = heads.transpose(1, 0, 2).reshape(x.shape[0], -1)  # (N, H d_v)
    return concat @ w_o.T + b_o, weights
