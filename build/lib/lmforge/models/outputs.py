"""What every model's forward returns: one dataclass, fields filled only when computed or asked for."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """Outputs of a forward pass. Unused fields stay None.

    logits: (B, T, V) token scores (LM / masked LM), or (B, C) / (B, T, C) for classification heads.
    loss: scalar mean cross-entropy over the positions with a label (ignore_index -100), when labels are given.
    hidden_states: (embeddings, after layer 1, ..., after layer L), each (B, T, D), on request.
    attentions: per layer (B, H, T, S) self-attention weights, on request (explicit attention path).
    cross_attentions: per decoder layer (B, H, T, S_src) cross-attention weights (Seq2Seq), on request.
    pooled: (B, D) tanh(W h_[CLS] + b), BERT's pooler.
    last_hidden_state: (B, T, D) output of the last layer (after the final LayerNorm for pre-LN models).
    next_sentence_logits: (B, 2) NSP scores (EncoderForPreTraining only).
    metrics: extra numbers a model computes for free (e.g. masked-LM accuracy), as 0-dim tensors left on the
        device (a float would make the host wait for it); the trainer averages them at evaluation.
    """

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    pooled: torch.Tensor | None = None
    last_hidden_state: torch.Tensor | None = None
    next_sentence_logits: torch.Tensor | None = None
    metrics: dict[str, torch.Tensor | float] | None = None
