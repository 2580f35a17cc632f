"""Output heads that sit on an encoder or decoder.

    LMHead                       h Eᵀ: scores over the vocabulary, weight tied to the token embeddings E
    MaskedLMHead                 BERT: transform (dense, GELU, LayerNorm), then h Eᵀ + b, E tied
    NextSentenceHead             BERT: 2-way "is B the sentence after A" from the pooled [CLS]
    SequenceClassificationHead   dropout + linear on the pooled [CLS]
    TokenClassificationHead      dropout + linear at every position (NER, POS tagging)
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.nn import activation_fn


class LMHead(nn.Module):
    """Logits = h Wᵀ with W (V, D); ``tie(embedding)`` makes W the token embedding matrix itself."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def tie(self, embedding: nn.Embedding) -> None:
        self.proj.weight = embedding.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.proj(h)  # (B, T, V)


class MaskedLMHead(nn.Module):
    """BERT's MLM head: x = LN(act(h W_tᵀ + b_t)); logits = x Eᵀ + b, with E the word embeddings."""

    def __init__(self, d_model: int, vocab_size: int, activation: str = "gelu", eps: float = 1e-12) -> None:
        super().__init__()
        self.dense = nn.Linear(d_model, d_model)
        self.act = activation_fn(activation)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.decoder = nn.Linear(d_model, vocab_size, bias=True)

    def tie(self, embedding: nn.Embedding) -> None:
        self.decoder.weight = embedding.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(h))))  # (B, T, V)


class NextSentenceHead(nn.Module):
    """Scores (is-next, not-next) from the pooled [CLS] vector (Devlin et al. §3.1, task #2)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(d_model, 2)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(pooled)  # (B, 2)


class SequenceClassificationHead(nn.Module):
    """One label per sequence from the pooled [CLS] vector."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(pooled))  # (B, C)


class TokenClassificationHead(nn.Module):
    """One label per token from the last hidden states."""

    def __init__(self, d_model: int, num_labels: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, num_labels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(h))  # (B, T, C)
