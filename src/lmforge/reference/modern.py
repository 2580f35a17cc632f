"""The modern decoder's pieces in NumPy float64 (docs/modern.md): the oracle for the switches of DecoderConfig.

    rms_norm          y = g ⊙ x / sqrt(mean(x²) + eps)                                   Zhang & Sennrich 2019
    rotate            pair (x_j, x_{j+d/2}) turned by the angle pos · base^(-2j/d)       Su et al. 2021 (RoPE)
    relu_squared      relu(x)²                                                          So et al. 2021 (Primer)
    swiglu            (silu(x W_gᵀ) ⊙ x W_uᵀ) W_2ᵀ                                      Shazeer 2020
    soft_cap          c · tanh(z / c)                                                   Gemma 2, nanoGPT speedrun
    self_attention    multi-head (or grouped-query) attention with optional QK-norm and rotary positions
    decoder           a whole pre-norm decoder: embeddings, layers, final norm, head, soft-cap

Written from the equations, not from the torch modules: the rotation below is an explicit 2×2 rotation of
each feature pair, where ``lmforge.nn.RotaryEmbedding`` uses the "rotate half" identity.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from lmforge.reference.attention import causal_mask, split_heads
from lmforge.reference.gqa import grouped_heads
from lmforge.reference.layers import ACTIVATIONS, layer_norm


def rms_norm(x: np.ndarray, g: np.ndarray | None = None, eps: float = 1e-5) -> np.ndarray:
    """RMSNorm over the last axis: no centring, no shift; g = None leaves out the gain.

    >>> rms_norm(np.array([3.0, -4.0]), eps=0.0).round(4)       # rms = sqrt((9 + 16) / 2)
    array([ 0.8485, -1.1314])
    """
    y = x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps)
    return y if g is None else g * y


def relu_squared(x: np.ndarray) -> np.ndarray:
    """relu(x)²: zero for x < 0, then a parabola (Primer's 'squared ReLU')."""
    return np.maximum(x, 0.0) ** 2


def silu(x: np.ndarray) -> np.ndarray:
    """x · sigmoid(x) (Swish with β = 1)."""
    return x / (1.0 + np.exp(-x))


def swiglu(x: np.ndarray, w_1: np.ndarray, w_2: np.ndarray, b_1: np.ndarray | float = 0.0,
           b_2: np.ndarray | float = 0.0) -> np.ndarray:
    """SwiGLU feed-forward: w_1 (2 d_ff, D) stacks the gate W_g over the value W_u; w_2 (D, d_ff)."""
    gate, value = np.split(x @ w_1.T + b_1, 2, axis=-1)  # (N, d_ff) each
    return (silu(gate) * value) @ w_2.T + b_2


def feed_forward(x: np.ndarray, w_1: np.ndarray, w_2: np.ndarray, activation: str,
                 b_1: np.ndarray | float = 0.0, b_2: np.ndarray | float = 0.0) -> np.ndarray:
    """FFN(x) = act(x W_1ᵀ + b_1) W_2ᵀ + b_2 for relu, gelu, gelu_tanh, relu2; SwiGLU for 'swiglu'."""
    if activation == "swiglu":
        return swiglu(x, w_1, w_2, b_1, b_2)
    act = relu_squared if activation == "relu2" else ACTIVATIONS[activation]
    return act(x @ w_1.T + b_1) @ w_2.T + b_2


def rotate(x: np.ndarray, positions: Sequence[int] | np.ndarray, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding of x (..., T, d): feature j is paired with feature j + d/2, and the pair
    turns by θ_j = pos · base^(-2j/d):

        [x_j, x_{j+d/2}] ← [x_j cos θ_j - x_{j+d/2} sin θ_j,  x_j sin θ_j + x_{j+d/2} cos θ_j]

    >>> rotate(np.array([[1.0, 0.0]]), [0]), rotate(np.array([[1.0, 0.0]]), [1]).round(4)   # d = 2: θ = pos
    (array([[1., 0.]]), array([[0.5403, 0.8415]]))
    """
    d = x.shape[-1]
    half = d // 2
    theta = np.asarray(positions, dtype=np.float64)[:, None] * base ** (-2.0 * np.arange(half) / d)  # (T, d/2)
    out = np.empty_like(x)
    for j in range(half):
        c, s = np.cos(theta[:, j]), np.sin(theta[:, j])  # (T,)
        a, b = x[..., j], x[..., j + half]
        out[..., j] = a * c - b * s
        out[..., j + half] = a * s + b * c
    return out


def soft_cap(z: np.ndarray, cap: float) -> np.ndarray:
    """c · tanh(z / c): the identity near 0, bounded by ±c."""
    return cap * np.tanh(z / cap)


def self_attention(
    x: np.ndarray,
    p: Mapping[str, np.ndarray],
    n_heads: int,
    mask: np.ndarray | None = None,
    positions: Sequence[int] | np.ndarray | None = None,
    qk_norm: bool = False,
    eps: float = 1e-5,
    n_kv_heads: int | None = None,
    rope_base: float = 10000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head self-attention of x (N, D); returns (output (N, D), weights (H, N, N)).

    p: w_q (H d, D), w_k, w_v (H_kv d, D), w_o (D, H d), optional b_q, b_k, b_v, b_o; with qk_norm, g_q and
    g_k (d,). QK-norm first (RMSNorm of each head's q and k), then the rotation when positions are given.
    n_kv_heads: H_kv key/value heads, query head h reading group floor(h / (H / H_kv)) (None: H_kv = H).
    """
    n_kv_heads = n_kv_heads or n_heads
    q = split_heads(x @ p["w_q"].T + p.get("b_q", 0.0), n_heads)  # (H, N, d)
    k = split_heads(x @ p["w_k"].T + p.get("b_k", 0.0), n_kv_heads)  # (H_kv, N, d)
    v = split_heads(x @ p["w_v"].T + p.get("b_v", 0.0), n_kv_heads)
    if qk_norm:
        q, k = rms_norm(q, p["g_q"], eps), rms_norm(k, p["g_k"], eps)
    if positions is not None:
        q, k = rotate(q, positions, rope_base), rotate(k, positions, rope_base)
    heads, weights = grouped_heads(q, k, v, mask)  # (H, N, d), (H, N, N)
    concat = heads.transpose(1, 0, 2).reshape(x.shape[0], -1)  # (N, H d)
    return concat @ p["w_o"].T + p.get("b_o", 0.0), weights


def norm(x: np.ndarray, kind: str, g: np.ndarray, b: np.ndarray | None, eps: float) -> np.ndarray:
    """'layernorm' (shift b, or none) or 'rmsnorm' (gain only)."""
    if kind == "rmsnorm":
        return rms_norm(x, g, eps)
    return layer_norm(x, g, 0.0 if b is None else b, eps)


def decoder_layer(
    x: np.ndarray,
    p: Mapping[str, np.ndarray],
    n_heads: int,
    norm_kind: str = "layernorm",
    activation: str = "gelu_tanh",
    positions: Sequence[int] | np.ndarray | None = None,
    qk_norm: bool = False,
    eps: float = 1e-5,
    n_kv_heads: int | None = None,
    rope_base: float = 10000.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One pre-norm causal layer: h = x + MHA(N_1(x)); y = h + FFN(N_2(h)). Returns (y (N, D), weights).

    p: the attention's keys (``self_attention``), n1_g, n1_b, n2_g, n2_b (b absent: no shift),
    w_1, w_2 and optional b_1, b_2.
    """
    mask = causal_mask(x.shape[0])
    a, weights = self_attention(norm(x, norm_kind, p["n1_g"], p.get("n1_b"), eps), p, n_heads, mask,
                                positions, qk_norm, eps, n_kv_heads, rope_base)
    h = x + a
    f = feed_forward(norm(h, norm_kind, p["n2_g"], p.get("n2_b"), eps), p["w_1"], p["w_2"], activation,
                     p.get("b_1", 0.0), p.get("b_2", 0.0))
    return h + f, weights


def decoder(
    ids: Sequence[int],
    p: Mapping[str, object],
    n_heads: int,
    norm_kind: str = "layernorm",
    activation: str = "gelu_tanh",
    rotary: bool = False,
    qk_norm: bool = False,
    logit_softcap: float | None = None,
    eps: float = 1e-5,
    n_kv_heads: int | None = None,
    rope_base: float = 10000.0,
) -> np.ndarray:
    """Logits (T, V) of a decoder on token ids (T,):

        h_0 = E[x] (+ P[0..T-1] unless rotary);  h_l = layer_l(h_{l-1});  z = N_f(h_L) W_outᵀ;  soft-cap(z)

    p: tok_emb (V, D), pos_emb (max, D) unless rotary, layers (a list of ``decoder_layer`` dicts),
    nf_g, nf_b (optional), w_out (V, D) (the embedding itself for a tied head). The Llama family is
    norm_kind='rmsnorm', activation='swiglu', rotary=True with its rope_base, and n_kv_heads < n_heads.
    """
    ids = np.asarray(ids)
    positions = np.arange(len(ids))
    h = p["tok_emb"][ids]  # (T, D)
    if not rotary:
        h = h + p["pos_emb"][positions]
    for layer in p["layers"]:  # type: ignore[attr-defined]
        h, _ = decoder_layer(h, layer, n_heads, norm_kind, activation, positions if rotary else None, qk_norm, eps,
                             n_kv_heads, rope_base)
    z = norm(h, norm_kind, p["nf_g"], p.get("nf_b"), eps) @ p["w_out"].T  # (T, V)
    return z if logit_softcap is None else soft_cap(z, logit_softcap)
