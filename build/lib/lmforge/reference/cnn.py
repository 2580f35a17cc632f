"""The sentence CNN of seed 001 problem 3, written index by index (NumPy, float64).

    L_0[b, t, i]   = e[w[b, t], i]
    L_ℓ+1[b, t, i] = σ( Σ_{Δt, i'} W_ℓ+1[Δt, i', i] L_ℓ[b, 2t + Δt, i']  −  B_ℓ+1[i] )

Rows past the end of the sentence read as zero (L_ℓ[b, t', :] = 0 for t' ≥ T_ℓ), and the layer has
T_ℓ+1 = ⌈T_ℓ / 2⌉ outputs: one per window that starts inside the sentence. These functions take one
unpadded batch (every sentence the same length): padding is the torch module's business, and the tests
check that it gives these numbers for each sentence alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from lmforge.reference.rnn import sigmoid


def embedding_layer(w: np.ndarray, e: np.ndarray) -> np.ndarray:
    """L_0[b, t, i] = e[w[b, t], i]. w: (B, T) word ids, e: (V, D) -> (B, T, D).

    >>> embedding_layer(np.array([[1, 0]]), np.array([[0.0, 1.0], [2.0, 3.0]])).tolist()
    [[[2.0, 3.0], [0.0, 1.0]]]
    """
    n_b, n_t = w.shape
    out = np.zeros((n_b, n_t, e.shape[1]))
    for b in range(n_b):
        for t in range(n_t):
            out[b, t, :] = e[w[b, t], :]
    return out


def strided_convolution(
    layer: np.ndarray, w: np.ndarray, threshold: np.ndarray, sigma: Callable[[np.ndarray], np.ndarray] = sigmoid
) -> np.ndarray:
    """L_ℓ+1[b, t, i] = σ(Σ_{Δt, i'} W[Δt, i', i] L_ℓ[b, 2t + Δt, i'] − B[i]), by explicit loops.

    layer: L_ℓ (B, T, D_in); w: W (K, D_in, D_out); threshold: B (D_out,). Returns (B, ⌈T/2⌉, D_out).

    >>> L = np.ones((1, 3, 1)); W = np.ones((2, 1, 1))         # windows [0, 1] and [2, 3 = past the end]
    >>> strided_convolution(L, W, np.zeros(1), sigma=lambda z: z).ravel().tolist()
    [2.0, 1.0]
    """
    n_b, n_t, d_in = layer.shape
    width, _, d_out = w.shape
    t_out = (n_t + 1) // 2
    out = np.zeros((n_b, t_out, d_out))
    for b in range(n_b):
        for t in range(t_out):
            for i in range(d_out):
                total = 0.0
                for dt in range(width):
                    if 2 * t + dt >= n_t:  # past the end: a zero row
                        continue
                    for i_in in range(d_in):
                        total += w[dt, i_in, i] * layer[b, 2 * t + dt, i_in]
                out[b, t, i] = total - threshold[i]
    return sigma(out)


def sentence_cnn(
    w: np.ndarray,
    e: np.ndarray,
    weights: Sequence[np.ndarray],
    thresholds: Sequence[np.ndarray],
    sigma: Callable[[np.ndarray], np.ndarray] = sigmoid,
) -> list[np.ndarray]:
    """[L_0, L_1, ..., L_L] for word ids w (B, T): the embedding layer, then one stride-2 layer per (W, B)."""
    layers = [embedding_layer(w, e)]
    for w_l, b_l in zip(weights, thresholds, strict=True):
        layers.append(strided_convolution(layers[-1], w_l, b_l, sigma))
    return layers
