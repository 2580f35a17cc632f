"""K-quant GGUF blocks (Q4_K, Q5_K, Q6_K: what ``Q4_K_M`` and ``Q5_K_M`` files hold) dequantize to the values the
``gguf`` package's own reference gives (it follows ggml-quants.c), block for block, on random blocks."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.interop.gguf_file import dequantize
from lmforge.interop.kquants import BYTES

gguf = pytest.importorskip("gguf", reason="the gguf package (dev extra) is the reference for the block layouts")


def random_blocks(kind: str, n: int, seed: int) -> np.ndarray:
    """``n`` blocks of random bytes whose float16 fields are finite scales (as a quantizer writes them)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, BYTES[kind]), dtype=np.uint8)
    halves = [0, 2] if kind != "Q6_K" else [208]
    for at in halves:
        blocks[:, at: at + 2] = rng.uniform(-0.05, 0.05, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_blocks_dequantize_as_ggml(kind):
    blocks = random_blocks(kind, 64, seed=len(kind) + ord(kind[1]))
    ours = dequantize(blocks.reshape(-1), kind, (4, 16 * 256))  # 4 rows of 16 blocks
    ref = gguf.quants.dequantize(blocks.reshape(4, -1), gguf.GGMLQuantizationType[kind])  # (4, 4096)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)
    assert np.abs(ours).max() > 0  # blocks that hold something
