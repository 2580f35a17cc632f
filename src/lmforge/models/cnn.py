"""A sentence CNN (seed 001 problem 3): word embeddings, stacked stride-2 convolutions, a classifier.

The seed's model has parameters Φ = (e[w, i], W_1[Δt, i', i], B_1[i], ..., W_L[Δt, i', i], B_L[i]) and

    L_0[b, t, i]   = e[w[b, t], i]                                                   the embedding layer
    L_ℓ+1[b, t, i] = σ( Σ_{Δt, i'} W_ℓ+1[Δt, i', i] L_ℓ[b, 2t + Δt, i']  −  B_ℓ+1[i] )   stride 2

with Δt = 0 .. K−1 (K = ``kernel_width``), σ the logistic sigmoid (``activation``), and B a threshold that
is *subtracted*. Every layer halves the length: T_ℓ+1 = ⌈T_ℓ / 2⌉, so L layers leave ⌈T / 2^L⌉ positions,
which are pooled (max or mean) into one vector for the classification head.

Boundaries and padding. Rows past a sentence's end read as zero vectors: L_ℓ[b, t', :] = 0 for
t' ≥ n_ℓ(b), the sentence's length at layer ℓ (n_0 = its token count, n_ℓ+1 = ⌈n_ℓ / 2⌉). Output t is
real when its window starts inside the sentence (2t < n_ℓ). Zeroing the padded rows before each layer
and pooling over real positions only makes a padded batch give exactly what each sentence gives alone:
padding tokens cannot change a prediction.

Parallel depth. Every output of a layer depends only on the layer below, so with unlimited processors
the model runs in O(L) steps; L = ⌈log2 T⌉ layers already cover the whole sentence. An RNN needs O(T)
sequential steps (O(T + L) for L stacked layers): h_t waits for h_t−1.

    >>> import torch
    >>> model = CNNForSequenceClassification(CNNConfig(vocab_size=100, d_model=8, n_layers=3), num_labels=2)
    >>> out = model(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13]]), labels=torch.tensor([1]))
    >>> out.logits.shape, [h.shape[1] for h in model.cnn(torch.tensor([[5] * 9]), output_hidden_states=True)
    ...                    .hidden_states]
    (torch.Size([1, 2]), [9, 5, 3, 2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.models.common import check_ids, padding_mask, token_loss
from lmforge.models.config import (
    CONFIG_CLASSES,
    VOCAB,
    ConfigMixin,
    kind,
    rate,
    size,
    token_id,
)
from lmforge.models.heads import SequenceClassificationHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn.pooling import mean_pool
from lmforge.schema import setting

ACTIVATIONS = {"sigmoid": torch.sigmoid, "tanh": torch.tanh, "relu": F.relu, "gelu": F.gelu}


@dataclass
class CNNConfig(ConfigMixin):
    """The seed's sentence CNN: D channels at every layer (the embedding width too), L stride-2 layers."""

    vocab_size: int = size(help=VOCAB)
    d_model: int = size(256, "D: channels of e[w, i] and of every layer L_ℓ[b, t, i]")
    n_layers: int = size(4, "L: stride-2 convolution layers")
    kernel_width: int = setting(3, "K: Δt = 0 .. K-1", min=2)
    activation: Literal["sigmoid", "tanh", "relu", "gelu"] = setting("sigmoid", "σ of the seed, or tanh | relu | gelu")
    pooling: Literal["max", "mean"] = setting("max", "over the ⌈T / 2^L⌉ positions the last layer leaves")
    dropout: float = rate(0.1, "dropout on the embeddings and on the pooled vector")
    max_positions: int = size(512, "the longest input fine-tuning cuts to (the convolutions have no limit)")
    pad_id: int | None = token_id(0, "padding token id")
    kind: str = kind("cnn")


CONFIG_CLASSES.setdefault(CNNConfig.kind, CNNConfig)  # config.json files with kind "cnn" load as CNNConfig


def halved_lengths(n: int, n_layers: int) -> list[int]:
    """[n_0, n_1, ..., n_L] with n_ℓ+1 = ⌈n_ℓ / 2⌉: the length of every layer.

    >>> halved_lengths(9, 3)
    [9, 5, 3, 2]
    """
    lengths = [n]
    for _ in range(n_layers):
        lengths.append((lengths[-1] + 1) // 2)
    return lengths


class StridedConvolution(nn.Module):
    """One layer L_ℓ -> L_ℓ+1 = σ(Σ_{Δt,i'} W[Δt, i', i] L_ℓ[b, 2t + Δt, i'] − B[i]), stride 2.

    ``conv.weight`` is torch's (out, in, K) layout, i.e. W[Δt, i', i] = conv.weight[i, i', Δt]
    (``seed_weight`` returns it in the seed's order); ``threshold`` is B.
    """

    def __init__(self, d_model: int, kernel_width: int = 3, activation: str = "sigmoid") -> None:
        super().__init__()
        self.kernel_width = kernel_width
        self.conv = nn.Conv1d(d_model, d_model, kernel_width, stride=2, bias=False)
        self.threshold = nn.Parameter(torch.zeros(d_model))  # B_ℓ+1[i]
        self.act = ACTIVATIONS[activation]

    def seed_weight(self) -> torch.Tensor:
        """W[Δt, i', i] (K, D_in, D_out), the seed's index order."""
        return self.conv.weight.permute(2, 1, 0)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """h: (B, T, D) with zeros at padded rows, mask: (B, T) True = real -> ((B, ⌈T/2⌉, D), (B, ⌈T/2⌉))."""
        t_in = h.shape[1]
        t_out = (t_in + 1) // 2
        right = max(0, 2 * t_out + self.kernel_width - 2 - t_in)  # zero rows past the end fill the last windows
        x = F.pad(h.transpose(1, 2), (0, right))  # (B, D, T + right)
        y = self.conv(x)  # (B, D, T_out): y[b, i, t] = Σ W[Δt, i', i] L[b, 2t + Δt, i']
        y = self.act(y - self.threshold[:, None]).transpose(1, 2)  # (B, T_out, D)
        mask = mask[:, ::2]  # (B, T_out): output t is real when its window starts at a real row 2t
        return y * mask[..., None].to(y.dtype), mask


def masked_pool(h: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """Max or mean of h (B, T, D) over the real positions of mask (B, T) -> (B, D); 0 for an empty row."""
    if how == "max":
        pooled = h.masked_fill(~mask[..., None], float("-inf")).amax(dim=1)  # (B, D)
        return torch.where(mask.any(1, keepdim=True), pooled, torch.zeros_like(pooled))
    return mean_pool(h, mask)


class SentenceCNN(nn.Module):
    """L_0 = e[w], then L stride-2 convolutions; ``pooled`` is the max (or mean) over the last layer."""

    def __init__(self, config: CNNConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)  # e[w, i]
        self.layers = nn.ModuleList(
            StridedConvolution(config.d_model, config.kernel_width, config.activation) for _ in range(config.n_layers)
        )
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        **_: Any,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = real token (default: every token is real).

        Returns last_hidden_state (B, ⌈T / 2^L⌉, D), pooled (B, D) and, on request, hidden_states
        (L_0, ..., L_L) with padded rows zero.
        """
        check_ids(input_ids)
        mask = padding_mask(attention_mask)
        if mask is None:
            mask = torch.ones_like(input_ids, dtype=torch.bool)
        h = self.dropout(self.embed(input_ids)) * mask[..., None]  # (B, T, D): L_0[b, t, i] = e[w[b, t], i]
        hidden = [h]
        for layer in self.layers:
            h, mask = layer(h, mask)  # (B, ⌈T_ℓ / 2⌉, D)
            hidden.append(h)
        pooled = masked_pool(h, mask, self.config.pooling)  # (B, D)
        return ModelOutput(last_hidden_state=h, pooled=pooled,
                           hidden_states=tuple(hidden) if output_hidden_states else None)


class CNNForSequenceClassification(nn.Module):
    """One label per sentence from the pooled top layer of a SentenceCNN. logits (B, num_labels)."""

    def __init__(self, config: CNNConfig, num_labels: int) -> None:
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.cnn = SentenceCNN(config)
        self.head = SequenceClassificationHead(config.d_model, num_labels, config.dropout)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        **_: Any,
    ) -> ModelOutput:
        """labels: (B,) class indices. Extra batch keys (token_type_ids) are accepted and ignored."""
        out = self.cnn(input_ids, attention_mask, output_hidden_states)
        out.logits = self.head(out.pooled)  # (B, C)
        if labels is not None:
            out.loss = token_loss(out.logits, labels)
        return out


def cnn_classifier_for(tokenizer: Any, num_labels: int, **overrides: Any) -> CNNForSequenceClassification:
    """A freshly initialised CNN classifier whose vocabulary is ``tokenizer``'s (fine-tuning's ``--arch cnn``)."""
    config = CNNConfig(vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, **overrides)
    config.validate("cnn")
    return CNNForSequenceClassification(config, num_labels)


def forward_flops(config: CNNConfig, batch: int, length: int) -> list[int]:
    """Multiply-add FLOPs (2 per multiply-add) of each convolution layer: 2 · B · T_ℓ+1 · K · D · D.

    >>> forward_flops(CNNConfig(vocab_size=10, d_model=4, n_layers=3, kernel_width=2), batch=1, length=8)
    [256, 128, 64]
    """
    lengths = halved_lengths(length, config.n_layers)[1:]
    return [2 * batch * t * config.kernel_width * config.d_model * config.d_model for t in lengths]
