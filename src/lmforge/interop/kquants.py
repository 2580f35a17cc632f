"""llama.cpp's K-quant blocks, dequantized: the formats most published GGUF files use (``Q4_K_M`` files mix Q4_K
and Q6_K matrices, ``Q5_K_M`` Q5_K and Q6_K). A block holds 256 weights in 8 or 16 sub-blocks, each with its own
scale (and minimum), the scales themselves quantized against the block's float16 ``d`` (and ``dmin``):

    Q4_K (144 bytes)  d, dmin (f16); 8 six-bit scales s and mins m packed in 12 bytes; 256 four-bit q
                      x = d s_j · q - dmin m_j                           (sub-block j of 32 weights)
    Q5_K (176 bytes)  as Q4_K, and a fifth bit of every q in 32 bytes    x = d s_j · (q + 16 h) - dmin m_j
    Q6_K (210 bytes)  256 six-bit q (low 4 bits in 128 bytes, high 2 in 64); 16 int8 scales; d (f16)
                      x = d s_j · (q - 32)                               (sub-block j of 16 weights)

Layouts as ggml writes them (ggml-quants.c, ``dequantize_row_q*_K``): within each 64 weights of Q4_K / Q5_K, the
first 32 are the low nibbles of 32 bytes and the next 32 their high nibbles; Q6_K interleaves four 32-weight runs
per 128. Every product is taken in float32 in ggml's order, so the values are ggml's.
"""

from __future__ import annotations

import numpy as np

QK_K = 256  # weights per block
BYTES = {"Q4_K": 144, "Q5_K": 176, "Q6_K": 210}


def f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block, as float32 (n, 1)."""
    return blocks[:, at: at + 2].copy().view(np.float16).astype(np.float32)


def scales_and_mins(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K / Q5_K: the 12 bytes of 8 six-bit scales and 8 six-bit mins -> (n, 8) each, float32.

    Sub-blocks 0-3: the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); 4-7: a low nibble of bytes 8-11 (scales)
    or its high nibble (mins), topped by the 2 high bits of bytes 0-3 (scales) or 4-7 (mins)."""
    s = packed.astype(np.uint8)
    lo, mid, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([lo & 63, (hi & 0xF) | ((lo >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (hi >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def nibbles(qs: np.ndarray) -> np.ndarray:
    """128 bytes a block -> its 256 four-bit values in ggml's order, (n, 8, 32): sub-block 2c is the low nibbles of
    bytes 32c..32c+31, sub-block 2c + 1 their high nibbles."""
    runs = qs.reshape(len(qs), 4, 32)
    q = np.empty((len(qs), 8, 32), dtype=np.uint8)
    q[:, 0::2], q[:, 1::2] = runs & 0xF, runs >> 4
    return q


def dequantize_k(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes of one Q4_K / Q5_K / Q6_K tensor -> float32 values of ``shape``."""
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, BYTES[kind])  # (n, bytes)
    if kind == "Q6_K":
        return q6_k(blocks).reshape(shape)
    d, dmin = f16(blocks, 0), f16(blocks, 2)  # (n, 1)
    scales, mins = scales_and_mins(blocks[:, 4:16])  # (n, 8)
    if kind == "Q4_K":
        q = nibbles(blocks[:, 16:144]).astype(np.float32)
    else:  # Q5_K: bit j of byte l of qh is the fifth bit of weight l of sub-block j
        qh = blocks[:, 16:48]  # (n, 32)
        high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # (n, 8, 32)
        q = (nibbles(blocks[:, 48:176]) + 16 * high).astype(np.float32)
    step, low = (d * scales)[:, :, None], (dmin * mins)[:, :, None]  # (n, 8, 1): ggml's d1 and m1
    return (step * q - low).reshape(shape)


def q6_k(blocks: np.ndarray) -> np.ndarray:
    """Q6_K blocks (n, 210) -> (n, 256) float32."""
    d = f16(blocks, 208)  # (n, 1)
    sc = blocks[:, 192:208].view(np.int8).astype(np.float32)  # (n, 16)
    out = np.empty((len(blocks), QK_K), dtype=np.float32)
    for half in range(2):  # 128 weights each: 64 bytes of low bits, 32 of high bits, 8 scales
        ql, qh = blocks[:, 64 * half: 64 * half + 64], blocks[:, 128 + 32 * half: 160 + 32 * half]
        a, b = ql[:, :32], ql[:, 32:]
        runs = [(a & 0xF) | ((qh & 3) << 4), (b & 0xF) | (((qh >> 2) & 3) << 4),
                (a >> 4) | (((qh >> 4) & 3) << 4), (b >> 4) | (((qh >> 6) & 3) << 4)]
        for k, q in enumerate(runs):  # run k: weights 32k..32k+31 of the half, scales 2k (first 16) and 2k + 1
            scale = np.repeat(sc[:, 8 * half + 2 * k: 8 * half + 2 * k + 2], 16, axis=1)  # (n, 32)
            start = 128 * half + 32 * k
            out[:, start: start + 32] = (d * scale) * (q.astype(np.float32) - 32)
    return out


def q4_k_int4(raw: np.ndarray, shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K matrix (rows, columns) as int4 groups of 32, kept as its integers, in Q4_1's form x = d q + m: each
    sub-block of 32 weights is d s_j q - dmin m_j, so d = d s_j and m = -dmin m_j (float32, ggml's products) hold
    the block's values exactly. Returns (q (rows, columns) uint8 in [0, 15], d, m (rows, columns / 32));
    ``nn.quant`` then keeps s = d and z = m + 8 d in bfloat16, as for Q4_0 / Q4_1."""
    rows, columns = shape
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, BYTES["Q4_K"])  # (n, 144)
    d, dmin = f16(blocks, 0), f16(blocks, 2)  # (n, 1)
    scales, mins = scales_and_mins(blocks[:, 4:16])  # (n, 8)
    q = nibbles(blocks[:, 16:144]).reshape(rows, columns)
    return q, (d * scales).reshape(rows, columns // 32), (-(dmin * mins)).reshape(rows, columns // 32)
