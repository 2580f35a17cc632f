"""The token-level losses every model uses, and the label that means "no loss here".

``IGNORE_INDEX`` (-100, PyTorch's and Hugging Face's convention) marks positions that predict nothing:
padding, the unmasked tokens of masked LM, the non-first pieces of a tagged word, a prompt.

``chunked_token_loss`` is the same mean cross-entropy with the LM head inside it, run over a few rows at a time:
with a 49,152-word vocabulary, 8,192 scored positions make 1.6 GB of float32 logits, and as much again for their
softmax and its gradient; in chunks of 1,024 rows no more than one chunk's logits exist at once.

    >>> labels = torch.tensor([[5, -100, 7]])
    >>> round(float(token_loss(torch.zeros(1, 3, 10), labels)), 5)   # uniform logits: ln 10 over the 2 real labels
    2.30259
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE_INDEX = -100
LOSS_CHUNK_ROWS = 1024  # (1024, V) float32 logits: 200 MB at V = 49,152


def _scored(logits: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (n, V), in float32 unless already float64 (bf16/fp16 logits are scored in fp32)."""
    flat = logits.reshape(-1, logits.shape[-1])
    return flat if flat.dtype == torch.float64 else flat.float()


def token_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100. logits (..., V), labels (...).

    With label smoothing ε (Szegedy et al. 2016; Vaswani et al. §5.4 use ε = 0.1) the target is
    (1 - ε) on the label plus ε / V spread over the whole vocabulary.
    """
    return F.cross_entropy(_scored(logits), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Causal LM loss: the prediction at position t is scored against the token at t + 1.

    logits (B, T, V), labels (B, T) (usually the input ids, with -100 where no loss is wanted).
    """
    # Shift the labels left rather than the logits right: the same loss without copying (B, T - 1, V) logits.
    return token_loss(logits, F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX))


def _summed_head_loss(head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor,
                      targets: torch.Tensor) -> torch.Tensor:
    """Σ cross-entropy of head(h) (n, V) against targets (n,), -100 ignored: one chunk's share of the sum."""
    return F.cross_entropy(_scored(head(h)), targets, ignore_index=IGNORE_INDEX, reduction="sum")


def chunked_token_loss(head: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor, targets: torch.Tensor,
                       rows: int = LOSS_CHUNK_ROWS) -> tuple[torch.Tensor | None, torch.Tensor]:
    """``token_loss(head(h), targets)``, with the head run on at most ``rows`` positions at a time.

    head: (n, D) -> (n, V), the LM head; h: (N, D) hidden states; targets: (N,) token ids, -100 ignored.
    Returns (the logits (N, V) when N <= rows, else None; the mean loss over the targets). Over ``rows``
    positions each chunk's logits are made, summed into the loss and dropped, and made again in the backward
    pass (``torch.utils.checkpoint``): the peak holds one chunk's (rows, V) logits instead of N rows, for one
    more head product per chunk. Loss and gradients equal the plain loss's to float rounding
    (tests/test_memory.py).
    """
    if len(h) <= rows:  # one chunk: the plain path, nothing recomputed
        logits = head(h)  # (N, V)
        return logits, token_loss(logits, targets)
    total = sum(checkpoint(_summed_head_loss, head, h[i: i + rows], targets[i: i + rows], use_reentrant=False)
                for i in range(0, len(h), rows))
    return None, total / (targets != IGNORE_INDEX).sum()
