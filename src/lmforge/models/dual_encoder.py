"""Cross-modal search (seed 000, questions 7 and 8): a dual encoder, contrastive training, recall@k, cross-attention.

Question 7 ranks sentences for images by projecting both into one space and taking dot products:

    S[i, j] = (I W_i)[i] · (T W_t)[j]                    (N_a, N_b); cosine: unit-length rows first

A *dual encoder* learns the two towers (here lmforge ``Encoder``s, mean-pooled over real tokens; with
``n_layers=0`` a tower is a bag of embeddings) and the projections W_i, W_t from pairs alone, with the
symmetric InfoNCE loss (CLIP): the true partner of each row must win a softmax over the batch, both ways,

    logits = S / τ                  L = ½ [CE(logits, diag) + CE(logitsᵀ, diag)]

where τ is a fixed or learned temperature (learned as log 1/τ, clipped at 1/τ <= 100). Retrieval quality
is recall@k: the share of queries whose partner ranks in the top k (``recall_at_k``).

Question 8 keeps W_i as the query map and W_t as the key map, and adds values, a softmax, an output
map and a residual: ``CrossModalBlock`` updates one modality's vectors from the other's.

    >>> cfg = DualEncoderConfig(vocab_size=50, d_model=16, d_embed=8, n_heads=2, d_ff=32, max_positions=16)
    >>> model = DualEncoder(cfg).eval()
    >>> out = model(torch.tensor([[5, 6, 7], [8, 9, 0]]), torch.tensor([[10, 11, 0], [12, 13, 14]]))
    >>> out.logits.shape, out.loss.shape                         # (B, B) scores / τ, a scalar
    (torch.Size([2, 2]), torch.Size([]))
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models.config import (
    CONFIG_CLASSES,
    VOCAB,
    Activation,
    ConfigMixin,
    EncoderConfig,
    count,
    epsilon,
    kind,
    rate,
    size,
    token_id,
    where,
)
from lmforge.models.encoder import Encoder
from lmforge.models.outputs import ModelOutput
from lmforge.nn import FeedForward, MultiHeadAttention
from lmforge.nn.pooling import mean_pool
from lmforge.schema import setting

MAX_SCALE = 100.0  # 1 / τ never exceeds this (CLIP's clip), so the logits stay bounded


@dataclass
class DualEncoderConfig(ConfigMixin):
    """Two towers (token ids -> mean-pooled vectors) and two projections into a shared d_embed space.

    vocab_size_b: the second modality's vocabulary (None: the same tokenizer for both). n_layers: BERT
    layers per tower (0: a bag of embeddings). share_towers: one tower for both sides (projections stay
    two). similarity: 'cosine' or 'dot'. temperature: τ at the start; learn_temperature trains it.
    """

    vocab_size: int = size(help=VOCAB)
    vocab_size_b: int | None = size(None, "the second modality's vocabulary (null: the same tokenizer)")
    d_model: int = size(128, "tower width d_model")
    n_layers: int = count(0, "BERT layers per tower (0: a bag of embeddings)")
    n_heads: int = size(4, "attention heads (divide d_model)")
    d_ff: int = size(256, "feed-forward width")
    max_positions: int = size(128, "longest input")
    d_embed: int = size(128, "width of the shared embedding space")
    similarity: Literal["cosine", "dot"] = setting("cosine", "cosine | dot")
    temperature: float = setting(0.05, "τ at the start (>= 1 / 100: the logits stay bounded)", min=1 / MAX_SCALE)
    learn_temperature: bool = setting(True, "train τ")
    share_towers: bool = setting(False, "one tower for both sides (the projections stay two)")
    dropout: float = rate(0.1)
    activation: Activation = setting("gelu", "feed-forward non-linearity: relu | gelu | gelu_tanh")
    eps: float = epsilon(1e-12)
    pad_id: int | None = token_id(0, "padding token id")
    kind: str = kind("dual-encoder")

    def validate(self, source: str = "config") -> None:
        super().validate(source)
        if self.share_towers and self.vocab_size_b not in (None, self.vocab_size):
            raise LmforgeError(f"{where(source)}share_towers needs one vocabulary, got {self.vocab_size} and "
                               f"{self.vocab_size_b}")

    def tower_config(self, vocab_size: int) -> EncoderConfig:
        return EncoderConfig(vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers,
                             n_heads=self.n_heads, d_ff=self.d_ff, max_positions=self.max_positions,
                             dropout=self.dropout, attention_dropout=self.dropout, activation=self.activation,
                             eps=self.eps, pad_id=self.pad_id)


CONFIG_CLASSES.setdefault(DualEncoderConfig.kind, DualEncoderConfig)  # config.json kind "dual-encoder"


# -- the pieces as functions: pooling, scores, loss, recall ---------------------------------------------
def similarity(a: torch.Tensor, b: torch.Tensor, kind: str = "cosine") -> torch.Tensor:
    """S[i, j] = a_i · b_j ('dot') or a_i · b_j / (|a_i| |b_j|) ('cosine'): a (N, E), b (M, E) -> (N, M).

    >>> similarity(torch.tensor([[3.0, 0.0]]), torch.tensor([[1.0, 0.0], [0.0, 2.0]]), "dot").tolist()
    [[3.0, 0.0]]
    """
    if kind == "cosine":
        a, b = F.normalize(a, dim=-1), F.normalize(b, dim=-1)
    elif kind != "dot":
        raise LmforgeError(f"similarity must be cosine or dot, not {kind!r}")
    return a @ b.T


def info_nce(logits: torch.Tensor) -> torch.Tensor:
    """Symmetric contrastive loss: row i's partner is column i, and column i's partner is row i.

    logits (B, B) = S / τ. Uniform logits give log B:

    >>> round(info_nce(torch.zeros(4, 4)).item(), 4) == round(math.log(4), 4)
    True
    """
    if logits.dim() != 2 or logits.shape[0] != logits.shape[1]:
        raise LmforgeError(f"info_nce needs square (B, B) logits, got {tuple(logits.shape)}")
    target = torch.arange(logits.shape[0], device=logits.device)
    return 0.5 * (F.cross_entropy(logits, target) + F.cross_entropy(logits.T, target))


def recall_at_k(scores: torch.Tensor, ks: Sequence[int] = (1, 5, 10),
                targets: torch.Tensor | None = None) -> dict[int, float]:
    """Share of queries (rows) whose correct candidate (column ``targets[i]``, default i) ranks in the top k.

    The rank of the correct candidate is 1 + the number of *other* candidates scoring at least as high:
    ties count against it, so a model that scores everything equally gets recall 0, not 1.

    >>> s = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.8], [0.4, 0.4, 0.4]])
    >>> recall_at_k(s, ks=(1, 2, 3))          # ranks 1, 2, 3 (the tie in row 3 counts against it)
    {1: 0.3333333333333333, 2: 0.6666666666666666, 3: 1.0}
    """
    n_q, n_c = scores.shape
    if targets is None:
        if n_q > n_c:
            raise LmforgeError(f"recall_at_k: {n_q} queries but {n_c} candidates; pass targets")
        targets = torch.arange(n_q, device=scores.device)
    correct = scores.gather(1, targets[:, None])  # (N_q, 1)
    others = torch.ones_like(scores, dtype=torch.bool).scatter_(1, targets[:, None], False)  # (N_q, N_c)
    rank = 1 + ((scores >= correct) & others).sum(dim=1)  # (N_q,)
    return {k: int((rank <= k).sum()) / n_q for k in ks}


# -- the dual encoder ------------------------------------------------------------------------------
class DualEncoder(nn.Module):
    """Tower a and tower b (``Encoder`` + mean pooling), projections W_a, W_b, and a temperature."""

    def __init__(self, config: DualEncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        c.validate()
        self.tower_a = Encoder(c.tower_config(c.vocab_size))
        self.tower_b = self.tower_a if c.share_towers else Encoder(c.tower_config(c.vocab_size_b or c.vocab_size))
        for tower in (self.tower_a, self.tower_b):
            tower.pooler = nn.Identity()  # mean pooling replaces BERT's [CLS] pooler: no unused weights
        self.proj_a = nn.Linear(c.d_model, c.d_embed, bias=False)  # W_i of seed 000 Q7, as (out, in)
        self.proj_b = nn.Linear(c.d_model, c.d_embed, bias=False)  # W_t
        log_scale = torch.tensor(math.log(1.0 / c.temperature))  # log 1/τ
        if c.learn_temperature:
            self.log_scale = nn.Parameter(log_scale)
        else:
            self.register_buffer("log_scale", log_scale)
        nn.init.normal_(self.proj_a.weight, std=c.d_model**-0.5)
        nn.init.normal_(self.proj_b.weight, std=c.d_model**-0.5)

    @property
    def temperature(self) -> float:
        return 1.0 / float(self.log_scale.detach().exp().clamp(max=MAX_SCALE))

    def _embed(self, tower: Encoder, proj: nn.Linear, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None and self.config.pad_id is not None:
            mask = (ids != self.config.pad_id).long()
        hidden = tower(ids, attention_mask=mask).last_hidden_state  # (B, T, D)
        return proj(mean_pool(hidden, mask))  # (B, E)

    def embed_a(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Modality a (token ids (B, T), mask 1 = real; default: not pad_id) -> (B, d_embed), unnormalised."""
        return self._embed(self.tower_a, self.proj_a, ids, mask)

    def embed_b(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Modality b -> (B, d_embed)."""
        return self._embed(self.tower_b, self.proj_b, ids, mask)

    def scores(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """S (N_a, N_b) from embeddings a (N_a, E), b (N_b, E), by the configured similarity."""
        return similarity(a, b, self.config.similarity)

    def forward(
        self,
        ids_a: torch.Tensor,
        ids_b: torch.Tensor,
        mask_a: torch.Tensor | None = None,
        mask_b: torch.Tensor | None = None,
        return_loss: bool = True,
    ) -> ModelOutput:
        """A batch of B pairs (row i of a goes with row i of b) -> logits S / τ (B, B) and the InfoNCE loss."""
        a, b = self.embed_a(ids_a, mask_a), self.embed_b(ids_b, mask_b)
        scale = self.log_scale.exp().clamp(max=MAX_SCALE)  # 1/τ
        logits = self.scores(a, b) * scale  # (B, B)
        return ModelOutput(logits=logits, loss=info_nce(logits) if return_loss else None,
                           metrics={"temperature": 1.0 / scale.detach()})  # a tensor: no wait for the device


# -- question 8: update one modality from the other ----------------------------------------------------
class CrossModalBlock(nn.Module):
    """x ← x + CrossAttn(LN(x), LN_m(M));  x ← x + FFN(LN(x))   (pre-LN; FFN left out when d_ff = 0).

    x (B, T, d_model) is the modality being updated (its vectors ask, through W_q), M (B, S, d_memory) the
    one read from (through W_k and W_v). A row with nothing to read (S = 0, or every memory position
    masked) is returned exactly as it came in: no attention, and no feed-forward update either.

    >>> block = CrossModalBlock(d_model=4, d_memory=2, n_heads=1, d_ff=8)
    >>> y, w = block(torch.randn(2, 3, 4), torch.randn(2, 5, 2), need_weights=True)
    >>> y.shape, w.shape                                    # (B, T, d_model), (B, H, T, S)
    (torch.Size([2, 3, 4]), torch.Size([2, 1, 3, 5]))
    """

    def __init__(self, d_model: int, d_memory: int, n_heads: int, d_ff: int = 0, d_qk: int | None = None,
                 dropout: float = 0.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm_x = nn.LayerNorm(d_model, eps=eps)
        self.norm_memory = nn.LayerNorm(d_memory, eps=eps)
        self.attn = MultiHeadAttention(d_model, n_heads, d_qk=d_qk, d_v=d_model // n_heads if d_qk else None,
                                       cross=True, d_memory=d_memory, dropout=dropout)
        self.norm_ffn = nn.LayerNorm(d_model, eps=eps) if d_ff else None
        self.ffn = FeedForward(d_model, d_ff) if d_ff else None
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, memory_mask: torch.Tensor | None = None,
                need_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, T, d_model), memory (B, S, d_memory), memory_mask (B, S) 1 = real -> (x', weights (B, H, T, S))."""
        b, t, _ = x.shape
        s = memory.shape[1]
        if s == 0:
            return x, (x.new_zeros(b, self.attn.n_heads, t, 0) if need_weights else None)
        mask = None if memory_mask is None else memory_mask.bool()  # (B, S)
        update, weights = self.attn(self.norm_x(x), self.norm_memory(memory), key_padding_mask=mask,
                                    need_weights=need_weights)
        y = x + self.dropout(update)  # (B, T, d_model)
        if self.ffn is not None:
            y = y + self.dropout(self.ffn(self.norm_ffn(y)))
        if mask is not None:
            reads = mask.any(dim=1)[:, None, None]  # (B, 1, 1): does the row have anything to read?
            y = torch.where(reads, y, x)
        return y, weights
