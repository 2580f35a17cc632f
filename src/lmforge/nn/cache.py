"""A preallocated key/value cache for incremental decoding.

Each attention layer owns one ``KVCache``. During generation the keys and values of earlier positions
are kept, so step t computes projections for the new token only and attends over all t keys:
O(t) work per step instead of re-running the whole prefix. The buffers are allocated once at the
maximum length (no ``torch.cat`` per step), and ``length`` says how much of them is filled.

This is the cache of one batch decoded together (generation/steps.py, for the models the decoding engine
does not drive). The engine keeps many requests in fixed-shape slots instead (generation/slots.py), behind
the same protocol (``append``, ``keys_values``, ``length``): the attention layers serve both.
"""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values of one attention layer, shape (B, H, max_len, d) each, filled up to ``length``.

    >>> cache = KVCache(batch=1, n_heads=2, max_len=8, d_k=4, d_v=4)
    >>> k, v = cache.append(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4))
    >>> k.shape, cache.length
    (torch.Size([1, 2, 3, 4]), 3)
    """

    def __init__(
        self,
        batch: int,
        n_heads: int,
        max_len: int,
        d_k: int,
        d_v: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        self.k = torch.empty(batch, n_heads, max_len, d_k, dtype=dtype, device=device)
        self.v = torch.empty(batch, n_heads, max_len, d_v, dtype=dtype, device=device)
        self.length = 0
        self.static = False  # True once holding cross-attention memory, which never grows

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def reset(self) -> None:
        """Empty again (the buffers are kept): one cache serves many generations of the same shape."""
        self.length, self.static = 0, False

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H, T, d) after the filled part; return all keys and values so far."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; cannot grow to {end}")
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, :, : self.length], self.v[:, :, : self.length]

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search reorders hypotheses after each step).

        Same batch size: in place, so the buffers keep their addresses (a CUDA graph reads them there).
        """
        if len(index) == self.k.shape[0]:
            self.k.copy_(self.k.index_select(0, index))
            self.v.copy_(self.v.index_select(0, index))
            return
        self.k = self.k.index_select(0, index)
        self.v = self.v.index_select(0, index)
