"""The token-level losses every model uses, and the label that means "no loss here".

``IGNORE_INDEX`` (-100, PyTorch's and Hugging Face's convention) marks positions that predict nothing:
padding, the unmasked tokens of masked LM, the non-first pieces of a tagged word, a prompt.

    >>> labels = torch.tensor([[5, -100, 7]])
    >>> round(float(token_loss(torch.zeros(1, 3, 10), labels)), 5)   # uniform logits: ln 10 over the 2 real labels
    2.30259
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


def token_loss(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Mean cross-entropy over positions whose label is not -100. logits (..., V), labels (...).

    With label smoothing ε (Szegedy et al. 2016; Vaswani et al. §5.4 use ε = 0.1) the target is
    (1 - ε) on the label plus ε / V spread over the whole vocabulary.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    flat = flat if flat.dtype == torch.float64 else flat.float()  # bf16/fp16 logits scored in fp32
    return F.cross_entropy(flat, labels.reshape(-1),
                           ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)


def next_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Causal LM loss: the prediction at position t is scored against the token at t + 1.

    logits (B, T, V), labels (B, T) (usually the input ids, with -100 where no loss is wanted).
    """
    # Shift the labels left rather than the logits right: the same loss without copying (B, T - 1, V) logits.
    return token_loss(logits, F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX))
