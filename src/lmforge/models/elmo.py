"""ELMo's bidirectional language model (Peters et al. 2018): two LSTM LMs, 2L + 1 representations, a mix.

A forward LM reads left to right and predicts the next token, a backward LM reads right to left and
predicts the previous one. They share the token representation Θ_x and the softmax Θ_s but not their
LSTMs, and training maximises the two log-likelihoods together (the joint loss is the mean of the two
directions' mean negative log-likelihoods):

    Σ_k  log p(t_k | t_1 .. t_{k-1}; Θ_x, →Θ_LSTM, Θ_s)  +  log p(t_k | t_{k+1} .. t_N; Θ_x, ←Θ_LSTM, Θ_s)

Each token t_k then has 2L + 1 representations, which ``forward(..., output_hidden_states=True)`` returns
as L + 1 tensors of width 2·d_model:

    h_{k,0} = [x_k; x_k]          the token embedding, duplicated to the width of the others (as in the paper)
    h_{k,j} = [→h_{k,j}; ←h_{k,j}] j = 1 .. L, the two directions' layer-j states side by side

and a task reads ELMo_k = γ Σ_j softmax(s)_j h_{k,j} (``lmforge.nn.mix.ScalarMix``; the task models below).

A small, faithful version of the paper's model. Each layer is an LSTM with a projection (Sak et al. 2014:
4096 cells projected to 512 in the paper, ``d_hidden`` → ``d_model`` here), layers after the first add a
residual connection, and dropout sits before every layer and before the softmax. Two departures: tokens
come from lmforge's sub-word tokenizers (an embedding table) instead of the paper's character CNN, and
the paper's cell/projection clipping (±3) is left out so that PyTorch's fused LSTM kernel can run.

    >>> model = BiLM(BiLMConfig(vocab_size=50, d_model=8, d_hidden=16, n_layers=2)).eval()
    >>> ids = torch.tensor([[5, 6, 7, 8]])
    >>> out = model(ids, labels=ids, output_hidden_states=True)
    >>> len(out.hidden_states), out.hidden_states[0].shape, out.logits.shape   # 2L + 1 = 5 -> 3 layers of 2·8
    (3, torch.Size([1, 4, 16]), torch.Size([1, 4, 50]))
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models.config import (
    CONFIG_CLASSES,
    PRESETS,
    VOCAB,
    ConfigMixin,
    kind,
    rate,
    size,
    token_id,
)
from lmforge.models.outputs import ModelOutput
from lmforge.nn.loss import IGNORE_INDEX
from lmforge.nn.lstm import reverse_padded
from lmforge.nn.mix import ScalarMix
from lmforge.nn.pooling import mean_pool
from lmforge.schema import setting

warnings.filterwarnings("ignore", message="LSTM with projections is not supported with oneDNN")


@dataclass
class BiLMConfig(ConfigMixin):
    """ELMo's biLM: L layers of projected LSTMs per direction, a shared embedding and a shared softmax.

    d_model is the token embedding and each layer's output (the paper's 512 projection), d_hidden the LSTM
    cells (4096); d_hidden == d_model means no projection. max_positions only caps the lengths fine-tuning
    and prediction cut inputs to: an LSTM has no position table.
    """

    vocab_size: int = size(help=VOCAB)
    d_model: int = size(128, "token embedding and each layer's output (the paper's 512 projection)")
    d_hidden: int = size(512, "LSTM cells (the paper's 4096; = d_model: no projection)")
    n_layers: int = size(2, "LSTM layers per direction")
    dropout: float = rate(0.1)
    residual: bool = setting(True, "layer j > 1 adds its input to its output (the paper's skip connection)")
    tie_embeddings: bool = setting(False, "the softmax reuses the input embedding (the paper keeps them apart)")
    max_positions: int = size(512, "the longest input fine-tuning cuts to (an LSTM has no position table)")
    pad_id: int | None = token_id(0, "padding token id")
    bos_id: int | None = token_id(None, "beginning-of-text token id")
    eos_id: int | None = token_id(None, "end-of-text token id")
    kind: str = kind("bilm")


CONFIG_CLASSES.setdefault(BiLMConfig.kind, BiLMConfig)  # config.json files with kind "bilm" load as BiLMConfig
PRESETS.setdefault("bilm-tiny", BiLMConfig(vocab_size=1000, d_model=64, d_hidden=128, n_layers=2, max_positions=128))
# Peters et al. §3 / appendix: L = 2, 4096 cells, 512 projections, residual between layers (their
# softmax covers the 793,471 words of the 1B Word Benchmark; here it is the tokenizer's vocabulary).
PRESETS.setdefault("elmo", BiLMConfig(vocab_size=793471, d_model=512, d_hidden=4096, n_layers=2))


class ProjectedLSTM(nn.Module):
    """One left-to-right LSTM layer whose recurrent state is a projection of h (Sak et al. 2014).

        z_t = W_ih x_t + W_hh r_{t-1} + b          gates i, f, g, o as in ``lmforge.nn.lstm``
        c_t = σ(f) ⊙ c_{t-1} + σ(i) ⊙ tanh(g)
        r_t = W_hr (σ(o) ⊙ tanh(c_t))             (B, P): the output and the next step's recurrent input

    With proj_size 0 there is no W_hr and r_t = h_t: the plain cell of ``lmforge.nn.lstm.LSTMCell``.
    ``explicit=True`` runs the equations step by step; otherwise PyTorch's fused kernel runs them.

    >>> layer = ProjectedLSTM(3, 8, proj_size=2)
    >>> layer(torch.randn(4, 5, 3)).shape, layer.weight_hh.shape     # W_hh acts on the 2-wide r_{t-1}
    (torch.Size([4, 5, 2]), torch.Size([32, 2]))
    """

    def __init__(self, input_size: int, hidden_size: int, proj_size: int = 0, forget_bias: float = 1.0) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.proj_size = input_size, hidden_size, proj_size
        j, r = hidden_size, proj_size or hidden_size
        self.weight_ih = nn.Parameter(torch.empty(4 * j, input_size))  # (4J, I)
        self.weight_hh = nn.Parameter(torch.empty(4 * j, r))  # (4J, P)
        self.bias = nn.Parameter(torch.empty(4 * j))  # (4J,)
        self.weight_hr = nn.Parameter(torch.empty(r, j)) if proj_size else None  # (P, J)
        self.forget_bias = forget_bias
        self.reset_parameters()

    @property
    def output_size(self) -> int:
        return self.proj_size or self.hidden_size

    def reset_parameters(self) -> None:
        """U(-1/√J, 1/√J) like PyTorch's LSTM; the forget gate's bias starts at ``forget_bias``."""
        bound = 1.0 / math.sqrt(self.hidden_size)
        for p in self.parameters():
            nn.init.uniform_(p, -bound, bound)
        with torch.no_grad():
            self.bias[self.hidden_size: 2 * self.hidden_size].fill_(self.forget_bias)

    def forward(self, x: torch.Tensor, explicit: bool = False) -> torch.Tensor:
        """x (B, T, I) -> r (B, T, P), starting from zero state."""
        b = x.shape[0]
        r0 = x.new_zeros(b, self.output_size)  # (B, P)
        c0 = x.new_zeros(b, self.hidden_size)  # (B, J)
        if explicit:
            return self._explicit(x, r0, c0)
        weights = [self.weight_ih, self.weight_hh, self.bias, torch.zeros_like(self.bias)]
        if self.weight_hr is not None:
            weights.append(self.weight_hr)
        out, _, _ = torch.lstm(x, (r0[None], c0[None]), weights, True, 1, 0.0, False, False, True)
        return out  # (B, T, P)

    def _explicit(self, x: torch.Tensor, r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        outputs = []
        for t in range(x.shape[1]):
            z = x[:, t] @ self.weight_ih.T + r @ self.weight_hh.T + self.bias  # (B, 4J)
            z_i, z_f, z_g, z_o = z.chunk(4, dim=-1)  # each (B, J)
            c = torch.sigmoid(z_f) * c + torch.sigmoid(z_i) * torch.tanh(z_g)
            h = torch.sigmoid(z_o) * torch.tanh(c)  # (B, J)
            r = h @ self.weight_hr.T if self.weight_hr is not None else h  # (B, P)
            outputs.append(r)
        return torch.stack(outputs, dim=1)  # (B, T, P)


@dataclass
class BiLMStates:
    """embeddings x (B, T, D); forward[j] = →h_{j+1}, backward[j] = ←h_{j+1}, each (B, T, D), 0 at padding."""

    embeddings: torch.Tensor
    forward: list[torch.Tensor]
    backward: list[torch.Tensor]

    def representations(self) -> tuple[torch.Tensor, ...]:
        """The 2L + 1 representations as L + 1 tensors (B, T, 2D): [x; x], then [→h_j; ←h_j]."""
        x = self.embeddings
        return (torch.cat([x, x], -1), *(torch.cat(p, -1) for p in zip(self.forward, self.backward, strict=True)))


class BiLM(nn.Module):
    """ELMo's biLM. forward(input_ids, attention_mask, labels) -> ModelOutput.

    logits: the forward LM's next-token scores (B, T, V) (position t scores token t + 1); loss: the joint
    loss; metrics: ``forward_loss`` and ``backward_loss`` (each direction's mean NLL; exp gives perplexity);
    hidden_states (on request): the L + 1 representations, each (B, T, 2·d_model).
    """

    label_shift = 1  # the trainer counts labels[:, 1:]: the forward LM's targets (see ``lm_loss``)

    def __init__(self, config: BiLMConfig) -> None:
        super().__init__()
        self.config = config
        d, j = config.d_model, config.d_hidden
        proj = d if j != d else 0
        self.embed = nn.Embedding(config.vocab_size, d)  # Θ_x, shared by the two directions
        self.forward_layers = nn.ModuleList(ProjectedLSTM(d, j, proj) for _ in range(config.n_layers))  # →Θ_LSTM
        self.backward_layers = nn.ModuleList(ProjectedLSTM(d, j, proj) for _ in range(config.n_layers))  # ←Θ_LSTM
        self.softmax = nn.Linear(d, config.vocab_size)  # Θ_s, shared by the two directions
        if config.tie_embeddings:
            self.softmax.weight = self.embed.weight
        self.drop = nn.Dropout(config.dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A fresh biLM: embedding and softmax ~ N(0, 1/d_model), softmax bias 0, LSTMs as ``ProjectedLSTM``."""
        nn.init.normal_(self.embed.weight, std=1.0 / math.sqrt(self.config.d_model))
        if not self.config.tie_embeddings:
            nn.init.normal_(self.softmax.weight, std=1.0 / math.sqrt(self.config.d_model))
        nn.init.zeros_(self.softmax.bias)
        for layer in (*self.forward_layers, *self.backward_layers):
            layer.reset_parameters()

    def _stack(self, layers: nn.ModuleList, x: torch.Tensor, keep: torch.Tensor, explicit: bool) -> list[torch.Tensor]:
        """Run one direction's layers bottom to top over x (B, T, D); returns each layer's output (B, T, D)."""
        outs, h = [], x
        for j, layer in enumerate(layers):
            out = layer(self.drop(h), explicit) * keep  # (B, T, D)
            h = out + h if self.config.residual and j > 0 else out
            outs.append(h)
        return outs

    def states(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
               explicit: bool = False) -> BiLMStates:
        """Both directions' states. Rows are right-padded (mask 1 = real): the forward LM reaches the
        padding only after a row's real tokens, and the backward LM reads each row's real tokens reversed
        (``reverse_padded``), so padding never changes a real position."""
        if input_ids.dim() != 2:
            raise LmforgeError(f"input_ids must have shape (batch, length), got {tuple(input_ids.shape)}")
        mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
        lengths = mask.long().sum(1)  # (B,)
        keep = mask[..., None].to(self.embed.weight.dtype)  # (B, T, 1)
        x = self.embed(input_ids) * keep  # (B, T, D)
        forward = self._stack(self.forward_layers, x, keep, explicit)
        backward = self._stack(self.backward_layers, reverse_padded(x, lengths), keep, explicit)  # reversed rows
        return BiLMStates(x, forward, [reverse_padded(h, lengths) for h in backward])

    def representations(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                        explicit: bool = False) -> tuple[torch.Tensor, ...]:
        """The L + 1 tensors (B, T, 2D) a task mixes: [x; x], [→h_1; ←h_1], ..., [→h_L; ←h_L]."""
        return self.states(input_ids, attention_mask, explicit).representations()

    def lm_logits(self, states: BiLMStates) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward logits scoring t + 1, backward logits scoring t - 1), each (B, T, V), one shared softmax."""
        return self.softmax(self.drop(states.forward[-1])), self.softmax(self.drop(states.backward[-1]))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, output_hidden_states: bool = False,
                explicit: bool = False, **_: Any) -> ModelOutput:
        states = self.states(input_ids, attention_mask, explicit)
        fwd_logits, bwd_logits = self.lm_logits(states)
        layers = states.representations()  # L + 1 of (B, T, 2D)
        out = ModelOutput(logits=fwd_logits, last_hidden_state=layers[-1])
        if output_hidden_states:
            out.hidden_states = layers
        if labels is not None:
            if attention_mask is not None:
                labels = labels.masked_fill(attention_mask == 0, IGNORE_INDEX)
            out.loss, fwd, bwd = lm_loss(fwd_logits, bwd_logits, labels, attention_mask)
            out.metrics = {"forward_loss": fwd.detach(), "backward_loss": bwd.detach()}
        return out


def lm_loss(fwd_logits: torch.Tensor, bwd_logits: torch.Tensor, labels: torch.Tensor,
            attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(joint loss, forward mean NLL, backward mean NLL) from logits (B, T, V) and labels (B, T), -100 = none.

    The forward LM at position t predicts labels[t + 1], the backward LM at t predicts labels[t - 1]; a
    padded position (attention_mask 0) predicts nothing, and labels there should be -100. With
    n = the forward targets (labels[:, 1:] that are not -100, what the trainer counts with label_shift 1):

        joint = (Σ forward NLL + Σ backward NLL) / 2n

    Each row's labels form one run of real tokens (windows, right padding), so both directions have n
    targets and the joint loss is exactly ½ (forward mean + backward mean): the paper's objective, averaged.
    A batch's joint loss is also a plain sum over targets / 2n, so the trainer's accumulation stays exact.

    >>> logits = torch.zeros(1, 3, 4)                                  # uniform: each NLL is log 4
    >>> [round(float(v), 4) for v in lm_loss(logits, logits, torch.tensor([[1, 2, 3]]))]
    [1.3863, 1.3863, 1.3863]
    """
    fwd_targets, bwd_targets = labels[:, 1:], labels[:, :-1]  # (B, T - 1) each
    if attention_mask is not None:  # the predicting position must be real: t for the forward, t + 1 for the backward
        fwd_targets = fwd_targets.masked_fill(attention_mask[:, :-1] == 0, IGNORE_INDEX)
        bwd_targets = bwd_targets.masked_fill(attention_mask[:, 1:] == 0, IGNORE_INDEX)
    nll_f = F.cross_entropy(fwd_logits[:, :-1].flatten(0, 1).float(), fwd_targets.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    nll_b = F.cross_entropy(bwd_logits[:, 1:].flatten(0, 1).float(), bwd_targets.flatten(), ignore_index=IGNORE_INDEX,
                            reduction="sum")
    n_f = (fwd_targets != IGNORE_INDEX).sum().clamp(min=1)
    n_b = (bwd_targets != IGNORE_INDEX).sum().clamp(min=1)
    return (nll_f + nll_b) / (2 * n_f), nll_f / n_f, nll_b / n_b


# -- task models: the frozen or fine-tuned biLM under a classification head -------------------------------------
class BiLMForTokenClassification(nn.Module):
    """A label per token from the top layer [→h_L; ←h_L], or, after ``use_mix()``, from ELMo's mix
    γ Σ_j softmax(s)_j h_j of all L + 1 representations (the paper's task-specific weighting).

    The head is dropout + one linear map of the 2·d_model features (the paper feeds ELMo into a task
    RNN; a linear head keeps the comparison with lmforge's Transformer encoders direct).

    >>> tagger = BiLMForTokenClassification(BiLMConfig(vocab_size=50, d_model=8, d_hidden=16), num_labels=3)
    >>> [round(w, 4) for w in tagger.use_mix().mix.weights().tolist()]     # starts as the plain average
    [0.3333, 0.3333, 0.3333]
    """

    token_level = True

    def __init__(self, config: BiLMConfig, num_labels: int) -> None:
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.encoder = BiLM(config)
        self.head = TaskHead(2 * config.d_model, num_labels, config.dropout)
        self.mix: ScalarMix | None = None

    def use_mix(self) -> BiLMForTokenClassification:
        """Read γ Σ softmax(s)_j h_j instead of the top layer (adds L + 2 parameters under ``mix.``)."""
        if self.mix is None:
            self.mix = ScalarMix(self.config.n_layers + 1).to(self.encoder.embed.weight.device)
        return self

    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        layers = self.encoder.representations(input_ids, attention_mask)  # L + 1 of (B, T, 2D)
        return self.mix(layers) if self.mix is not None else layers[-1]  # (B, T, 2D)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **_: Any) -> ModelOutput:
        h = self.features(input_ids, attention_mask)  # (B, T, 2D)
        # token-cls: the head at every position (B, T, C); seq-cls: on the mean over real tokens (B, C)
        logits = self.head(h if self.token_level else mean_pool(h, attention_mask))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE_INDEX)
        return ModelOutput(logits=logits, loss=loss)


class BiLMForSequenceClassification(BiLMForTokenClassification):
    """One label per sequence from the masked mean of the top layer (or of ELMo's mix) over real tokens."""

    token_level = False


class TaskHead(nn.Module):
    """dropout, then a linear map to the labels: (..., 2D) -> (..., C)."""

    def __init__(self, d_in: int, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_in, num_labels)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.dropout(h))


def bilm_task_model(bilm: BiLM, task: str, num_labels: int) -> BiLMForTokenClassification:
    """A fresh head for ``task`` ("seq-cls" or "token-cls") on a pretrained biLM (its weights are shared)."""
    cls = BiLMForSequenceClassification if task == "seq-cls" else BiLMForTokenClassification
    model = cls(bilm.config, num_labels)
    model.encoder = bilm
    return model


def apply_bilm_strategy(model: BiLMForTokenClassification, strategy: str, mix: bool) -> BiLMForTokenClassification:
    """``lmforge finetune``'s strategies on a biLM task model: full trains everything; frozen trains the head
    (and, with ``mix``, the L + 1 scalars s and γ). LoRA and adapters need attention projections."""
    if strategy not in ("full", "frozen"):
        raise LmforgeError(f"--strategy {strategy}: LoRA and adapters wrap attention projections and a biLM (LSTM) "
                           "has none; use --strategy full or frozen (with --mix)")
    if mix:
        model.use_mix()
    for name, p in model.named_parameters():
        p.requires_grad_(strategy == "full" or name.startswith(("head.", "mix.")))
    return model
