"""Multi-head attention: self, cross and causal, with padding masks, a KV cache and inspectable weights.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
    head_h = Attention(X W_q^hᵀ, M W_k^hᵀ, M W_v^hᵀ)              M = X for self-attention
    MHA(X, M) = concat(head_1, ..., head_H) W_oᵀ

Two paths give the same outputs: the explicit path writes the softmax out and can return the attention
weights (for inspection and teaching); the fast path calls ``torch.nn.functional.scaled_dot_product_attention``
(fused kernels, no (T, T) weight tensor kept for backward). Asking for weights selects the explicit path.

Weight convention (DESIGN.md): every projection is an ``nn.Linear`` (out, in). Head h uses rows
[h*d_qk, (h+1)*d_qk) of W_q and W_k and rows [h*d_v, (h+1)*d_v) of W_v. Per-head query/key width d_qk
and value width d_v may differ (seed 000 Q2's M_QK and M_V). For self-attention W_q, W_k and W_v are
stacked in one ``in_proj`` (one matmul instead of three); cross-attention has ``q_proj`` for the
queries and ``kv_proj`` for the memory.

Masks are boolean with True = may attend. A query that may attend to nothing gets zero weights and a
zero output on both paths.

QK-norm (``qk_norm=True``; Dehghani et al. 2023, Wortsman et al. 2023, the nanoGPT speedrun) puts an
RMSNorm over each head's queries and keys before the dot product, q ← RMSNorm(q), k ← RMSNorm(k), so
|q · k| <= max|g_q| · max|g_k| · d_qk whatever the weights grow to: the attention logits cannot blow up and
saturate the softmax, which lets a model train at higher learning rates. With rotary positions the norm
comes first, then the rotation (a rotation keeps the norm).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.cache import KVCache
from lmforge.nn.norms import RMSNorm
from lmforge.nn.positions import RotaryEmbedding


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # (B, T, d_out)
    weights: torch.Tensor | None  # (B, H, T, S) when asked for, else None


def attention_scores_softmax(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q kᵀ * scale) with masked keys removed; rows with no allowed key become all zeros.

    q: (B, H, T, d_qk), k: (B, H, S, d_qk), mask: broadcastable to (B, H, T, S). Returns (B, H, T, S).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S)
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # all-masked rows: 0, not NaN


def causal_mask(t: int, s: int, device: torch.device | None = None) -> torch.Tensor:
    """(t, s) boolean mask for t new queries that follow s - t cached positions: query i sees keys <= s - t + i.

    >>> causal_mask(2, 3).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def build_mask(
    t: int,
    s: int,
    causal: bool,
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    device: torch.device,
) -> torch.Tensor | None:
    """Combine causal, padding (B, S) and explicit (broadcastable to (B, H, T, S)) masks into one, or None."""
    mask = causal_mask(t, s, device) if causal else None
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :].bool()  # (B, 1, 1, S)
        mask = pad if mask is None else mask & pad
    if attn_mask is not None:
        mask = attn_mask.bool() if mask is None else mask & attn_mask.bool()
    return mask


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention and an output projection.

    Args:
        d_model: width of the query-side input and of the output.
        n_heads: number of heads H.
        d_qk: per-head query/key width (default d_model / H).
        d_v: per-head value width (default d_model / H).
        cross: attend over a separate ``memory`` (encoder output) instead of the input itself.
        d_memory: width of the memory (default d_model), for cross-attention.
        causal: each position attends only to itself and earlier positions.
        bias: biases on the projections.
        dropout: dropout on the attention weights (training only).
        rotary: a ``RotaryEmbedding`` applied to queries and keys (self-attention only).
        qk_norm: RMSNorm each head's queries and keys (gains of width d_qk, shared by the heads).
        eps: the QK-norm epsilon.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_qk: int | None = None,
        d_v: int | None = None,
        cross: bool = False,
        d_memory: int | None = None,
        causal: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        rotary: RotaryEmbedding | None = None,
        qk_norm: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__()
        if (d_qk is None or d_v is None) and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if rotary is not None and cross:
            raise ValueError("rotary positions apply to self-attention, not cross-attention")
        self.n_heads = n_heads
        self.d_qk = d_qk or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        self.cross = cross
        self.causal = causal
        self.dropout = dropout
        self.rotary = rotary
        self.scale = 1.0 / math.sqrt(self.d_qk)
        qk, v = n_heads * self.d_qk, n_heads * self.d_v
        if cross:
            self.q_proj = nn.Linear(d_model, qk, bias=bias)
            self.kv_proj = nn.Linear(d_memory or d_model, qk + v, bias=bias)
        else:
            self.in_proj = nn.Linear(d_model, 2 * qk + v, bias=bias)  # [W_q; W_k; W_v]
        self.out_proj = nn.Linear(v, d_model, bias=bias)
        self.q_norm = RMSNorm(self.d_qk, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.d_qk, eps) if qk_norm else None

    # -- the three projections, as the paper names them -------------------------------------------
    def split_heads(self, x: torch.Tensor, d_head: int) -> torch.Tensor:
        """(B, T, H*d_head) -> (B, H, T, d_head)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, d_head).transpose(1, 2)

    def project(
        self, x: torch.Tensor, memory: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Queries from x; keys and values from memory (cross) or x (self). Shapes (B, H, T|S, d)."""
        qk = self.n_heads * self.d_qk
        if self.cross:
            q = self.q_proj(x)
            if memory is None:
                return self.split_heads(q, self.d_qk), None, None  # keys/values come from the cache
            k, v = self.kv_proj(memory).split([qk, self.n_heads * self.d_v], dim=-1)
        else:
            q, k, v = self.in_proj(x).split([qk, qk, self.n_heads * self.d_v], dim=-1)
        return self.split_heads(q, self.d_qk), self.split_heads(k, self.d_qk), self.split_heads(v, self.d_v)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | None = None,
    ) -> AttentionOutput:
        """x: (B, T, d_model); memory: (B, S, d_memory) for cross-attention.

        key_padding_mask: (B, S) True for real keys (with a cache: covering cached and new keys).
        attn_mask: boolean, broadcastable to (B, H, T, S). cache: keys/values of earlier steps (self-
        attention grows it; cross-attention fills it once from ``memory`` and reuses it).
        positions: (T,) or (B, T) positions of the new queries, for rotary embeddings.
        Returns the output (B, T, d_model) and, if ``need_weights``, the weights (B, H, T, S).
        """
        if self.cross and memory is None and (cache is None or cache.length == 0):
            raise ValueError("cross-attention needs a memory (or a filled cache)")
        q, k, v = self.project(x, memory if not (self.cross and cache is not None and cache.length) else None)
        if self.q_norm is not None:  # QK-norm: each head's q and k rescaled to unit RMS, then the gains
            q = self.q_norm(q)  # (B, H, T, d_qk)
            k = self.k_norm(k) if k is not None else None  # (B, H, S, d_qk); None: cross keys come cached
        if self.rotary is not None:
            if positions is None:
                start = cache.length if cache is not None else 0
                positions = torch.arange(start, start + x.shape[1], device=x.device)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if cache is not None:
            if self.cross:
                if cache.length == 0:
                    cache.append(k, v)
                    cache.static = True
                k, v = cache.keys_values()
            else:
                k, v = cache.append(k, v)
        t, s = q.shape[2], k.shape[2]
        causal = self.causal and not self.cross and t > 1  # one new query may see every cached key
        dropout = self.dropout if self.training else 0.0

        if need_weights:  # explicit path: the equations, weights kept
            mask = build_mask(t, s, causal, key_padding_mask, attn_mask, x.device)
            weights = attention_scores_softmax(q, k, mask, self.scale)  # (B, H, T, S)
            heads = torch.matmul(F.dropout(weights, dropout, self.training), v)  # (B, H, T, d_v)
        else:  # fast path: fused kernel
            only_causal = key_padding_mask is None and attn_mask is None
            if causal and only_causal and t == s:
                heads = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
            else:
                mask = build_mask(t, s, causal, key_padding_mask, attn_mask, x.device)
                heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout)
            weights = None
        b = x.shape[0]
        concat = heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_v)  # (B, T, H*d_v)
        return AttentionOutput(self.out_proj(concat), weights)

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        return KVCache(batch, self.n_heads, max_len, self.d_qk, self.d_v, dtype=dtype, device=device)
