"""Attention for RNN encoder-decoders (NumPy, float64): Bahdanau's additive and Luong's multiplicative scores.

A decoder state s (the query) scores every encoder state h_j (the memory), the scores become weights by
a softmax over the source, and the context is the weighted sum of the encoder states:

    additive        (Bahdanau et al. 2015; Luong's "concat")   e_j = vᵀ tanh(W_q s + W_k h_j)
    general         (Luong et al. 2015)                         e_j = sᵀ W h_j
    dot             (Luong et al. 2015)                         e_j = sᵀ h_j
    α = softmax(e)        c = Σ_j α_j h_j

Unlike the Transformer's scaled dot product, the scores are not divided by √d. Weights follow
``nn.Linear``, shape (out, in): W_q is (A, D_q), W_k is (A, D_m), v is (A,), and W is (D_q, D_m).
Masks are boolean, True = may attend; a masked source position gets weight exactly 0.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference.attention import softmax


def attend(scores: np.ndarray, memory: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """α = softmax(e) over the source (masked positions excluded), c = α h.

    scores (..., T, S), memory (..., S, D_m), mask broadcastable to (..., T, S) -> (context (..., T, D_m), α).

    >>> context, alpha = attend(np.array([[0.0, 0.0, 5.0]]), np.eye(3), np.array([True, True, False]))
    >>> alpha, context
    (array([[0.5, 0.5, 0. ]]), array([[0.5, 0.5, 0. ]]))
    """
    if mask is not None:
        scores = np.where(mask[..., None, :] if mask.ndim == memory.ndim - 1 else mask, scores, -np.inf)
    weights = softmax(scores, axis=-1)  # (..., T, S)
    return weights @ memory, weights


def additive_attention(
    query: np.ndarray, memory: np.ndarray, w_q: np.ndarray, w_k: np.ndarray, v: np.ndarray,
    mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """e_j = vᵀ tanh(W_q s + W_k h_j), then ``attend``.

    query (..., T, D_q), memory (..., S, D_m), w_q (A, D_q), w_k (A, D_m), v (A,), mask (..., S) True = attend.
    Returns (context (..., T, D_m), weights (..., T, S)).

    >>> s, h = np.array([[1.0]]), np.array([[1.0], [-1.0]])       # one query, two source states
    >>> _, alpha = additive_attention(s, h, np.array([[1.0]]), np.array([[1.0]]), np.array([1.0]))
    >>> alpha.round(4)                                            # e = [tanh 2, tanh 0] = [0.964, 0]
    array([[0.7239, 0.2761]])
    """
    q = query @ w_q.T  # (..., T, A)
    k = memory @ w_k.T  # (..., S, A)
    scores = np.tanh(q[..., :, None, :] + k[..., None, :, :]) @ v  # (..., T, S)
    return attend(scores, memory, mask)


def multiplicative_attention(
    query: np.ndarray, memory: np.ndarray, w: np.ndarray | None = None, mask: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """e_j = sᵀ W h_j ("general"), or e_j = sᵀ h_j ("dot") when ``w`` is None; then ``attend``.

    query (..., T, D_q), memory (..., S, D_m), w (D_q, D_m), mask (..., S) True = attend.
    Returns (context (..., T, D_m), weights (..., T, S)).

    >>> s, h = np.array([[1.0, 0.0]]), np.array([[2.0, 0.0], [0.0, 2.0]])
    >>> _, alpha = multiplicative_attention(s, h)                 # e = [2, 0]
    >>> alpha.round(4)
    array([[0.8808, 0.1192]])
    """
    keys = memory if w is None else memory @ w.T  # (..., S, D_q): W h_j
    scores = query @ np.swapaxes(keys, -1, -2)  # (..., T, S)
    return attend(scores, memory, mask)
