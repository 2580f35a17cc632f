"""Weight-only quantization in NumPy float64: the dequantized weights and their product, the oracle of nn/quant.py.

    int8, groups of g inputs    W[n, k] ≈ s[n, j] q[n, k]              j = k // g, q in [-127, 127]
    int4, groups of g inputs    W[n, k] ≈ s[n, j] (q[n, k] - 8) + z[n, j]     j = k // g, q in [0, 15]

(GGUF's Q4_0 is z = 0; its Q4_1, x = d q + m, is s = d, z = m + 8 d.) The product is x Ŵᵀ + b with Ŵ the
dequantized weight, in float64: what a kernel computes up to its own rounding. kernels.c's products round
their activations first, in blocks of 32 inputs (``quantize_activations``: x ≈ d xq, xq of 8 bits for int4, 16
for int8): their oracle is the float64 product of those.

    >>> dequantize_int4(np.array([[0, 8, 15, 9]]), np.array([[0.5, 1.0]]), np.array([[0.0, 2.0]]), 2).tolist()
    [[-4.0, 0.0, 9.0, 3.0]]
"""

from __future__ import annotations

import numpy as np


def dequantize_int8(q: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """q (N, K) integers in [-127, 127], scales (N, K / g) (or (N,): one a row) -> W (N, K) = s[n, k // g] q[n, k]."""
    q = np.asarray(q, np.float64)
    n, k = q.shape
    s = np.asarray(scales, np.float64).reshape(n, -1)  # (N, K/g)
    return (s[:, :, None] * q.reshape(n, s.shape[1], -1)).reshape(n, k)


def dequantize_int4(q: np.ndarray, scales: np.ndarray, zeros: np.ndarray, group: int) -> np.ndarray:
    """q (N, K) integers in [0, 15], scales and zeros (N, K / group) -> W (N, K) = s (q - 8) + z, group by group."""
    q = np.asarray(q, np.float64)
    n, k = q.shape
    s = np.asarray(scales, np.float64)[:, :, None]  # (N, K/g, 1)
    z = np.asarray(zeros, np.float64)[:, :, None]
    return (s * (q.reshape(n, k // group, group) - 8) + z).reshape(n, k)


def quantized_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """x (..., K) and a dequantized weight (N, K) -> x Wᵀ + b (..., N), in float64."""
    y = np.asarray(x, np.float64) @ np.asarray(weight, np.float64).T
    return y if bias is None else y + np.asarray(bias, np.float64)


def quantize_activations(x: np.ndarray, limit: int = 127, block: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """x (..., K) -> (xq (..., K) integers in [-limit, limit], d (..., K / block)), x ≈ d xq block by block:
    d = max |x| / limit and xq = rint(x limit / max |x|), each step in float32 as kernels.c rounds it (the integers
    must be the kernel's; the product that follows is float64). limit 127: int4's 8 bits; 32767: int8's 16."""
    x = np.asarray(x, np.float32)
    blocks = x.reshape(*x.shape[:-1], -1, block)  # (..., K/b, b)
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(limit) / amax, np.float32(0)).astype(np.float32)
    xq = np.clip(np.rint(blocks * inverse[..., None]), -limit, limit)
    return xq.reshape(x.shape), (amax / np.float32(limit)).astype(np.float32)


def dequantize_activations(xq: np.ndarray, d: np.ndarray, block: int = 32) -> np.ndarray:
    """``quantize_activations``' d xq, in float64 (exact)."""
    xq = np.asarray(xq, np.float64)
    return (xq.reshape(*xq.shape[:-1], -1, block) * np.asarray(d, np.float64)[..., None]).reshape(xq.shape)
