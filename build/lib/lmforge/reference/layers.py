"""Layer normalisation, the position-wise feed-forward network and one Transformer encoder layer (NumPy)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from lmforge.reference.attention import multi_head_attention


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """LN(x) = gamma * (x - mean) / sqrt(var + eps) + beta over the last axis (biased variance).

    >>> layer_norm(np.array([1.0, 2.0, 3.0]), np.ones(3), np.zeros(3)).round(4)
    array([-1.2247,  0.    ,  1.2247])
    """
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (x - mean) / np.sqrt(var + eps) + beta


def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0.0)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x), with the Gaussian CDF through erf (as BERT and torch's default).

    >>> gelu(np.array([-1.0, 0.0, 1.0])).round(4)
    array([-0.1587,  0.    ,  0.8413])
    """
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's tanh approximation of GELU."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


ACTIVATIONS = {"relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh}


def feed_forward(
    x: np.ndarray, w_1: np.ndarray, b_1: np.ndarray, w_2: np.ndarray, b_2: np.ndarray, activation: str = "relu"
) -> np.ndarray:
    """FFN(x) = act(x W_1ᵀ + b_1) W_2ᵀ + b_2, applied to each position independently.

    w_1: (d_ff, D), w_2: (D, d_ff). activation: 'relu' (Vaswani), 'gelu' (BERT) or 'gelu_tanh' (GPT-2).
    """
    return ACTIVATIONS[activation](x @ w_1.T + b_1) @ w_2.T + b_2


def encoder_layer(
    x: np.ndarray,
    params: Mapping[str, np.ndarray],
    n_heads: int,
    norm_position: str = "post",
    mask: np.ndarray | None = None,
    activation: str = "relu",
    eps: float = 1e-5,
) -> tuple[np.ndarray, np.ndarray]:
    """One Transformer encoder layer; returns (output (N, D), attention weights (H, N, N)).

    post-LN (Vaswani, BERT):  h = LN(x + MHA(x));      y = LN(h + FFN(h))
    pre-LN  (GPT-2):          h = x + MHA(LN(x));      y = h + FFN(LN(h))

    params: w_q, b_q, w_k, b_k, w_v, b_v, w_o, b_o, ln1_g, ln1_b, w_1, b_1, w_2, b_2, ln2_g, ln2_b.
    """
    p = params
    biases = (p["b_q"], p["b_k"], p["b_v"], p["b_o"])

    def attend(h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return multi_head_attention(h, p["w_q"], p["w_k"], p["w_v"], p["w_o"], n_heads, mask, biases=biases)

    def ffn(h: np.ndarray) -> np.ndarray:
        return feed_forward(h, p["w_1"], p["b_1"], p["w_2"], p["b_2"], activation)

    def ln1(h: np.ndarray) -> np.ndarray:
        return layer_norm(h, p["ln1_g"], p["ln1_b"], eps)

    def ln2(h: np.ndarray) -> np.ndarray:
        return layer_norm(h, p["ln2_g"], p["ln2_b"], eps)

    if norm_position == "post":
        a, weights = attend(x)
        h = ln1(x + a)
        return ln2(h + ffn(h)), weights
    if norm_position == "pre":
        a, weights = attend(ln1(x))
        h = x + a
        return h + ffn(ln2(h)), weights
    raise ValueError(f"norm_position must be 'post' or 'pre', not {norm_position!r}")
