"""Attention of an RNN decoder over the encoder states: additive (Bahdanau) and multiplicative (Luong).

The query is one decoder state s_t per target step, the memory the encoder states h_1..h_S:

    AdditiveAttention           e_tj = vᵀ tanh(W_q s_t + W_k h_j)      Bahdanau et al. 2015 (Luong's "concat")
    MultiplicativeAttention     e_tj = s_tᵀ W h_j   ("general")        Luong et al. 2015
                                e_tj = s_tᵀ h_j     ("dot")
    α_t = softmax_j(e_t)        c_t = Σ_j α_tj h_j

The part that depends on the memory only, the *keys* W_k h_j (additive) or W h_j (general), is computed
once per source by ``keys(memory)`` and passed back in at every decoder step, so a step costs O(S·D)
rather than O(S·D²). Both modules equal ``lmforge.reference.additive_attention`` /
``multiplicative_attention``; the mask is (B, S), True/1 = attend, and a masked position gets weight 0.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.errors import LmforgeError


class RNNAttention(nn.Module):
    """What both scores share: keys from the memory, masked softmax, weighted sum of the memory."""

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        """memory (B, S, D_m) -> keys (B, S, D_k): the memory-only part of the score, computed once."""
        raise NotImplementedError

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """query (B, T, D_q), keys (B, S, D_k) -> e (B, T, S)."""
        raise NotImplementedError

    def forward(self, query: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None = None,
                keys: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """query (B, T, D_q), memory (B, S, D_m), mask (B, S) -> (context (B, T, D_m), weights (B, T, S)).

        ``keys``: ``self.keys(memory)`` computed beforehand (a decoder passes the same keys at every step).
        """
        e = self.scores(query, self.keys(memory) if keys is None else keys)  # (B, T, S)
        if mask is not None:
            e = e.masked_fill(~mask.bool()[:, None, :], float("-inf"))
        weights = torch.softmax(e, dim=-1)  # (B, T, S)
        return weights @ memory, weights  # (B, T, D_m), (B, T, S)


class AdditiveAttention(RNNAttention):
    """e_tj = vᵀ tanh(W_q s_t + W_k h_j); W_q (A, D_q), W_k (A, D_m), v (A,), no biases (Bahdanau's eq. A.1.2).

    >>> attention = AdditiveAttention(query_size=4, memory_size=6, attention_size=5)
    >>> memory, mask = torch.randn(2, 3, 6), torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> context, weights = attention(torch.randn(2, 1, 4), memory, mask)
    >>> context.shape, weights[1, 0, 2].item()
    (torch.Size([2, 1, 6]), 0.0)
    """

    def __init__(self, query_size: int, memory_size: int, attention_size: int) -> None:
        super().__init__()
        self.w_q = nn.Linear(query_size, attention_size, bias=False)  # W_q: (A, D_q)
        self.w_k = nn.Linear(memory_size, attention_size, bias=False)  # W_k: (A, D_m)
        self.v = nn.Parameter(torch.empty(attention_size))  # v: (A,)
        nn.init.uniform_(self.v, -attention_size**-0.5, attention_size**-0.5)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        return self.w_k(memory)  # (B, S, A)

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        q = self.w_q(query)  # (B, T, A)
        hidden = torch.tanh_(q[:, :, None, :] + keys[:, None, :, :])  # (B, T, S, A), in place: one buffer
        return hidden @ self.v  # (B, T, S, A) @ (A,) -> (B, T, S)


class MultiplicativeAttention(RNNAttention):
    """e_tj = s_tᵀ W h_j with W (D_q, D_m) ("general"), or s_tᵀ h_j ("dot", needs D_q = D_m, no parameters).

    >>> attention = MultiplicativeAttention(4, 4, score="dot")
    >>> memory = torch.eye(4)[None, :2] * 2.0                      # two source states: 2·e_0, 2·e_1
    >>> _, weights = attention(torch.eye(4)[None, :1], memory)     # the query e_0 scores them [2, 0]
    >>> [round(w, 4) for w in weights.squeeze().tolist()]
    [0.8808, 0.1192]
    """

    def __init__(self, query_size: int, memory_size: int, score: str = "general") -> None:
        super().__init__()
        if score not in ("general", "dot"):
            raise LmforgeError(f"attention: multiplicative score must be 'general' or 'dot', got {score!r}")
        if score == "dot" and query_size != memory_size:
            raise LmforgeError(f"attention: 'dot' needs query size ({query_size}) = memory size ({memory_size})")
        self.score = score
        self.w = nn.Linear(memory_size, query_size, bias=False) if score == "general" else None  # W: (D_q, D_m)

    def keys(self, memory: torch.Tensor) -> torch.Tensor:
        return memory if self.w is None else self.w(memory)  # (B, S, D_q): W h_j

    def scores(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return query @ keys.transpose(1, 2)  # (B, T, D_q) @ (B, D_q, S) -> (B, T, S)


def make_attention(kind: str, query_size: int, memory_size: int, attention_size: int | None = None) -> RNNAttention:
    """``"additive"`` | ``"general"`` | ``"dot"`` -> the module (``attention_size`` defaults to ``query_size``)."""
    if kind == "additive":
        return AdditiveAttention(query_size, memory_size, attention_size or query_size)
    if kind in ("general", "dot"):
        return MultiplicativeAttention(query_size, memory_size, kind)
    raise LmforgeError(f"attention: must be additive, general or dot, got {kind!r}")
