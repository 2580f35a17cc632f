"""Multi-head attention: self, cross and causal, with padding masks, a KV cache and inspectable weights.

    Attention(Q, K, V) = softmax(Q Kᵀ / sqrt(d_k)) V
    head_h = Attention(X W_q^hᵀ, M W_k^g(h)ᵀ, M W_v^g(h)ᵀ)        M = X for self-attention
    MHA(X, M) = concat(head_1, ..., head_H) W_oᵀ

Grouped-query attention (Ainslie et al. 2023; Llama 2 70B, Llama 3, SmolLM2): H query heads share
H_kv <= H key/value heads, head h reading group g(h) = floor(h / (H / H_kv)). H_kv = H is multi-head
attention, H_kv = 1 multi-query attention (Shazeer 2019). The KV cache holds the H_kv heads only: H / H_kv
times less memory per token, the quantity that bounds batch-1 decoding's speed at long contexts.

Two paths give the same outputs: the explicit path writes the softmax out and can return the attention
weights (for inspection and teaching); the fast path calls ``torch.nn.functional.scaled_dot_product_attention``
(fused kernels, no (T, T) weight tensor kept for backward). Asking for weights selects the explicit path.

Weight convention (DESIGN.md): every projection is an ``nn.Linear`` (out, in). Head h uses rows [h*d_qk, (h+1)*d_qk) of
W_q, key/value head g rows [g*d_qk, (g+1)*d_qk) of W_k and [g*d_v, (g+1)*d_v) of W_v. Per-head query/key width
d_qk and value width d_v may differ (seed 000 Q2's M_QK and M_V). For self-attention W_q (H d_qk rows), W_k
(H_kv d_qk) and W_v (H_kv d_v) are stacked in one ``in_proj`` (one matmul instead of three); cross-attention has
``q_proj`` for the queries and ``kv_proj`` for the memory.

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
from lmforge.nn.positions import Angles, RotaryEmbedding


class AttentionOutput(NamedTuple):
    output: torch.Tensor  # (B, T, d_out)
    weights: torch.Tensor | None  # (B, H, T, S) when asked for, else None


def attention_scores_softmax(
    q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """softmax(q kᵀ * scale) with masked keys removed; rows with no allowed key become all zeros.

    q: (B, H, T, d_qk), k: (B, H, S, d_qk), mask: broadcastable to (B, H, T, S). Returns (B, H, T, S).
    """
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale  # (B, H, T, S), a new tensor: filled in place
    if mask is None:
        return torch.softmax(scores, dim=-1)
    hidden = ~mask
    weights = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
    return weights.masked_fill(hidden.all(dim=-1, keepdim=True), 0.0)  # all-masked rows: 0, not NaN


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


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, S, d) -> (B, H_kv·groups, S, d): key/value head g serves query heads g·groups ... g·groups + groups-1.

    >>> repeat_kv(torch.tensor([10.0, 20.0]).view(1, 2, 1, 1), 3).flatten().tolist()
    [10.0, 10.0, 10.0, 20.0, 20.0, 20.0]
    """
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


def explicit_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, dropout: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The equation written out: heads = dropout(softmax(q kᵀ · scale)) v, the weights kept for inspection.

    q: (B, H, T, d_qk), k: (B, H_kv, S, d_qk), v: (B, H_kv, S, d_v) -> (heads (B, H, T, d_v), weights
    (B, H, T, S)): one row of weights per query head, whichever key/value head it shares.
    """
    groups = q.shape[1] // k.shape[1]
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)  # (B, H, S, d)
    weights = attention_scores_softmax(q, k, mask, scale)  # (B, H, T, S)
    dropped = F.dropout(weights, dropout) if dropout else weights
    return torch.matmul(dropped, v), weights  # (B, H, T, d_v), (B, H, T, S)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, dropout: float,
    causal: bool = False,
) -> torch.Tensor:
    """The same heads from torch's fused kernel, no (T, S) weights kept; shapes as ``explicit_attention``.

    ``causal=True`` (no cached keys, T == S, no other mask) lets the kernel draw its own triangle. Grouped
    keys and values go in as they are (``enable_gqa``): on CPU that measured as fast as or faster than
    expanding them to H heads first (torch 2.13, one thread; docs/models.md).
    """
    grouped = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal,
                                          enable_gqa=grouped)


def decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """One new query per row over its cached keys (a decoding step), written as two small products: the r = H/H_kv
    query heads of group g are stacked as r rows against g's keys, so keys and values are never repeated.

    q: (B, H, 1, d_qk), k: (B, H_kv, S, d_qk), v: (B, H_kv, S, d_v), mask broadcastable to (B, H, 1, S) ->
    (B, H, 1, d_v). The same heads as ``explicit_attention`` (to float rounding), without the fused kernel's
    mask handling and K/V repeat for grouped heads (faster for one query: docs/benchmarks.md), and a row's output
    has the same bits whatever the batch, the columns beyond its own and the thread count (tests/test_gqa.py),
    which the decoding engine needs.

    >>> q, k = torch.ones(1, 4, 1, 2), torch.ones(1, 2, 3, 2)
    >>> decode_attention(q, k, torch.arange(6.0).view(1, 2, 3, 1), None, 1.0).flatten().tolist()
    [1.0, 1.0, 4.0, 4.0]
    """
    b, h, t, _ = q.shape
    g = k.shape[1]
    grouped = q.reshape(b, g, h // g * t, q.shape[-1])  # (B, H_kv, r, d_qk): head h = g*r + j
    if mask is not None and mask.dim() >= 3 and mask.shape[-3] != 1:  # one mask per head: as the groups' rows
        mask = mask.expand(b, h, t, mask.shape[-1]).reshape(b, g, h // g * t, mask.shape[-1])  # (B, H_kv, r, S)
    weights = attention_scores_softmax(grouped, k, mask, scale)  # (B, H_kv, r, S)
    return torch.matmul(weights, v).view(b, h, t, v.shape[-1])  # (B, H, 1, d_v)


class MultiHeadAttention(nn.Module):
    """H heads of scaled dot-product attention and an output projection.

    ``forward`` is the whole computation in three steps, each a method below:

        q, k, v = self_qkv(x) | cross_qkv(x, memory)     projections, QK-norm, rotation, the cache
        heads   = attend(q, k, v, masks)                 explicit (weights kept) or fused
        output  = W_o concat(heads)

    Args:
        d_model: width of the query-side input and of the output.
        n_heads: number of (query) heads H.
        n_kv_heads: number of key/value heads H_kv, a divisor of H (default H: multi-head attention).
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
        n_kv_heads: int | None = None,
    ) -> None:
        super().__init__()
        n_kv_heads = n_kv_heads or n_heads
        if n_heads % n_kv_heads:
            raise ValueError(f"n_heads={n_heads} is not divisible by n_kv_heads={n_kv_heads}")
        if (d_qk is None or d_v is None) and d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if rotary is not None and cross:
            raise ValueError("rotary positions apply to self-attention, not cross-attention")
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.d_qk = d_qk or d_model // n_heads
        self.d_v = d_v or d_model // n_heads
        self.cross = cross
        self.causal = causal and not cross
        self.dropout = dropout
        self.rotary = rotary
        self.scale = 1.0 / math.sqrt(self.d_qk)
        q, k, v = self.widths()
        if cross:
            self.q_proj = nn.Linear(d_model, q, bias=bias)
            self.kv_proj = nn.Linear(d_memory or d_model, k + v, bias=bias)  # [W_k; W_v]
        else:
            self.in_proj = nn.Linear(d_model, q + k + v, bias=bias)  # [W_q; W_k; W_v]
        self.out_proj = nn.Linear(n_heads * self.d_v, d_model, bias=bias)
        self.q_norm = RMSNorm(self.d_qk, eps) if qk_norm else None
        self.k_norm = RMSNorm(self.d_qk, eps) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        cache: KVCache | None = None,
        positions: torch.Tensor | Angles | None = None,
    ) -> AttentionOutput:
        """x: (B, T, d_model); memory: (B, S, d_memory) for cross-attention.

        key_padding_mask: (B, S) True for real keys (with a cache: covering cached and new keys).
        attn_mask: boolean, broadcastable to (B, H, T, S). cache: keys/values of earlier steps (self-
        attention grows it; cross-attention fills it once from ``memory`` and reuses it).
        positions: (T,) or (B, T) positions of the new queries, for rotary embeddings (or their ``angles``).
        Returns the output (B, T, d_model) and, if ``need_weights``, the weights (B, H, T, S).
        """
        q, k, v = self.cross_qkv(x, memory, cache) if self.cross else self.self_qkv(x, cache, positions)
        heads, weights = self.attend(q, k, v, key_padding_mask, attn_mask, need_weights)  # (B, H, T, d_v)
        b, t = x.shape[:2]
        concat = heads.transpose(1, 2).reshape(b, t, self.n_heads * self.d_v)  # (B, T, H*d_v)
        return AttentionOutput(self.out_proj(concat), weights)

    # -- step 1: queries, keys and values -----------------------------------------------------------------
    def widths(self) -> tuple[int, int, int]:
        """Rows of W_q, W_k and W_v: H d_qk, H_kv d_qk, H_kv d_v (the blocks of ``in_proj``)."""
        return self.n_heads * self.d_qk, self.n_kv_heads * self.d_qk, self.n_kv_heads * self.d_v

    def split_heads(self, x: torch.Tensor, d_head: int) -> torch.Tensor:
        """(B, T, H*d_head) -> (B, H, T, d_head), for H query heads or H_kv key/value heads."""
        b, t, _ = x.shape
        return x.view(b, t, -1, d_head).transpose(1, 2)

    def normed(self, norm: RMSNorm | None, x: torch.Tensor) -> torch.Tensor:
        """QK-norm: each head's q (or k) rescaled to unit RMS, then the gains; the identity without it."""
        return x if norm is None else norm(x)  # (B, H, T, d_qk)

    def self_qkv(
        self, x: torch.Tensor, cache: KVCache | None, positions: torch.Tensor | Angles | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention: q, k, v all from x; QK-norm, then rotation; a cache adds the keys of earlier steps.

        Returns q (B, H, T, d_qk) and k (B, H_kv, S, d_qk), v (B, H_kv, S, d_v) with S = cached + T.
        """
        q, k, v = self.in_proj(x).split(self.widths(), dim=-1)
        q, k, v = self.split_heads(q, self.d_qk), self.split_heads(k, self.d_qk), self.split_heads(v, self.d_v)
        q, k = self.normed(self.q_norm, q), self.normed(self.k_norm, k)
        if self.rotary is not None:
            if positions is None:
                start = cache.length if cache is not None else 0
                positions = torch.arange(start, start + x.shape[1], device=x.device)  # (T,)
            q, k = self.rotary(q, positions), self.rotary(k, positions)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, S, d): the earlier steps' keys and values, then these
        return q, k, v

    def cross_qkv(
        self, x: torch.Tensor, memory: torch.Tensor | None, cache: KVCache | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cross-attention: q from x, k and v from the memory (B, S, d_memory), projected once with a cache.

        Returns q (B, H, T, d_qk), k (B, H_kv, S, d_qk), v (B, H_kv, S, d_v).
        """
        q = self.normed(self.q_norm, self.split_heads(self.q_proj(x), self.d_qk))  # (B, H, T, d_qk)
        if cache is not None and cache.length:  # filled on the first step, the same memory after
            return (q, *cache.keys_values())
        if memory is None:
            raise ValueError("cross-attention needs a memory (or a filled cache)")
        k, v = self.kv_proj(memory).split(self.widths()[1:], dim=-1)
        k, v = self.normed(self.k_norm, self.split_heads(k, self.d_qk)), self.split_heads(v, self.d_v)
        if cache is not None:
            cache.append(k, v)
            cache.static = True
        return q, k, v

    # -- step 2: the attention itself ------------------------------------------------------------------
    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        key_padding_mask: torch.Tensor | None,
        attn_mask: torch.Tensor | None,
        need_weights: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """heads (B, H, T, d_v), and the weights (B, H, T, S) when asked for (the explicit path), else None."""
        t, s = q.shape[2], k.shape[2]
        causal = self.causal and t > 1  # one new query may see every cached key
        dropout = self.dropout if self.training else 0.0
        if not need_weights and causal and t == s and key_padding_mask is None and attn_mask is None:
            return fused_attention(q, k, v, None, dropout, causal=True), None
        mask = build_mask(t, s, causal, key_padding_mask, attn_mask, q.device)  # (B|1, H|1, T, S) or None
        if need_weights:
            return explicit_attention(q, k, v, mask, self.scale, dropout)
        if t == 1 and not dropout:  # one query a row (a decoding step): two small products, no K/V repeat
            return decode_attention(q, k, v, mask, self.scale), None
        return fused_attention(q, k, v, mask, dropout), None

    def new_cache(self, batch: int, max_len: int, dtype: torch.dtype, device: torch.device) -> KVCache:
        """Keys and values of the H_kv key/value heads only: (B, H_kv, max_len, d) each."""
        return KVCache(batch, self.n_kv_heads, max_len, self.d_qk, self.d_v, dtype=dtype, device=device)
