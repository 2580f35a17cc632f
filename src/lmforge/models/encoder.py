"""BERT (Devlin et al. 2018): a bidirectional Transformer encoder, and the models built on it.

    h_0 = Dropout(LN(E[x] + P[pos] + S[segment]))     token, learned position and segment embeddings
    h_l = TransformerLayer_l(h_{l-1})                  post-LN, GELU, attention over every real token
    pooled = tanh(h_L[:, 0] W_pᵀ + b_p)                the [CLS] vector through a dense layer

Each layer is ``lmforge.nn.TransformerLayer(norm_position="post")``, the layer the other models share.
Heads on top (``heads.py``): masked LM + next sentence (pre-training), sequence and token classification.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.models.common import IGNORE_INDEX, check_ids, check_length, init_weights, padding_mask, token_loss
from lmforge.models.config import EncoderConfig
from lmforge.models.heads import (
    MaskedLMHead,
    NextSentenceHead,
    SequenceClassificationHead,
    TokenClassificationHead,
)
from lmforge.models.outputs import ModelOutput
from lmforge.nn import LearnedPositions, TransformerLayer


class EncoderEmbeddings(nn.Module):
    """E[x] + P[pos] + S[segment], then LayerNorm and dropout. (B, T) ids -> (B, T, D)."""

    def __init__(self, c: EncoderConfig) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositions(c.max_positions, c.d_model)
        self.type_emb = nn.Embedding(c.type_vocab_size, c.d_model)
        self.norm = nn.LayerNorm(c.d_model, eps=c.eps)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (T,)
        h = self.tok_emb(input_ids) + self.pos_emb(positions)  # (B, T, D)
        h = h + (self.type_emb(token_type_ids) if token_type_ids is not None else self.type_emb.weight[0])
        return self.drop(self.norm(h))


class Encoder(nn.Module):
    """BERT without heads: embeddings, post-LN GELU layers, pooler.

    >>> from lmforge.models.config import get_preset
    >>> model = Encoder(get_preset("bert-tiny")).eval()
    >>> out = model(torch.tensor([[2, 5, 6, 3]]))
    >>> out.last_hidden_state.shape, out.pooled.shape
    (torch.Size([1, 4, 64]), torch.Size([1, 64]))
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        self.embeddings = EncoderEmbeddings(c)
        self.layers = nn.ModuleList(
            TransformerLayer(c.d_model, c.n_heads, c.d_ff, norm_position="post", activation=c.activation,
                             dropout=c.dropout, attention_dropout=c.attention_dropout, eps=c.eps)
            for _ in range(c.n_layers)
        )
        self.pooler = nn.Linear(c.d_model, c.d_model)  # W_p: (D, D)
        init_weights(self)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T); attention_mask (B, T) 1 = real token; token_type_ids (B, T) segment 0/1.

        Returns last_hidden_state (B, T, D), pooled (B, D), and on request hidden_states (L + 1 of
        them, the embeddings first) and attentions (L of (B, H, T, T)).
        """
        check_ids(input_ids)
        check_length(input_ids.shape[1], self.config.max_positions)
        mask = padding_mask(attention_mask)  # (B, T) or None
        h = self.embeddings(input_ids, token_type_ids)  # (B, T, D)
        hidden, attentions = [h], []
        for layer in self.layers:
            out = layer(h, key_padding_mask=mask, need_weights=output_attentions)
            h = out.hidden
            hidden.append(h)
            attentions.append(out.self_attention)
        pooled = torch.tanh(self.pooler(h[:, 0]))  # (B, D) from [CLS]
        return ModelOutput(
            last_hidden_state=h,
            pooled=pooled,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )


class EncoderForPreTraining(nn.Module):
    """BERT with its two pre-training heads: masked LM (logits) and next sentence (next_sentence_logits).

    loss = MLM cross-entropy over labelled positions (+ NSP cross-entropy when next_sentence_label is given).
    Only ~15% of positions carry a label, so with ``labels`` the vocabulary projection (the largest matmul
    of a small BERT) runs on those positions alone: ``logits`` is then (M, V) for the M labelled positions
    in row-major order, and ``metrics["mlm_accuracy"]`` their accuracy. Without labels it is (B, T, V).
    """

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = c = config
        self.encoder = Encoder(c)
        self.mlm = MaskedLMHead(c.d_model, c.vocab_size, c.activation, c.eps)
        self.nsp = NextSentenceHead(c.d_model)
        init_weights(self.mlm)
        init_weights(self.nsp)
        self.mlm.tie(self.encoder.embeddings.tok_emb)

    @classmethod
    def from_encoder(cls, encoder: Encoder) -> EncoderForPreTraining:
        """Fresh pre-training heads on a trained ``encoder`` (a checkpoint without them, e.g. MiniLM).

        The MLM transform and LayerNorm start as BERT initialises them, the decoder is the encoder's
        word-embedding matrix itself (tied) and its bias starts at zero; the NSP head is fresh too.
        """
        model = cls(encoder.config)
        model.encoder = encoder
        model.mlm.tie(encoder.embeddings.tok_emb)
        return model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """labels (B, T): original ids at masked positions, -100 elsewhere; next_sentence_label (B,) 0 = is next."""
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        out.next_sentence_logits = self.nsp(out.pooled)  # (B, 2)
        losses = []
        if labels is None:
            out.logits = self.mlm(out.last_hidden_state)  # (B, T, V)
        else:
            chosen = labels != IGNORE_INDEX  # (B, T)
            targets = labels[chosen]  # (M,)
            out.logits = self.mlm(out.last_hidden_state[chosen])  # (M, V)
            losses.append(token_loss(out.logits, targets))
            with torch.no_grad():  # a tensor, not a float: reading it would make the host wait for the device
                hits = (out.logits.argmax(-1) == targets).float()  # (M,)
                accuracy = hits.mean() if hits.numel() else hits.sum()  # no masked token: 0
            out.metrics = {"mlm_accuracy": accuracy}
        if next_sentence_label is not None:
            losses.append(token_loss(out.next_sentence_logits, next_sentence_label))
        if losses:
            out.loss = sum(losses[1:], losses[0])
        return out


class EncoderWithHead(nn.Module):
    """An Encoder and one classification head; a subclass says which features the head reads."""

    head_class: type[nn.Module]

    def __init__(self, config: EncoderConfig, num_labels: int) -> None:
        super().__init__()
        self.config, self.num_labels = config, num_labels
        self.encoder = Encoder(config)
        self.head = self.head_class(config.d_model, num_labels, config.dropout)
        init_weights(self.head)

    def features(self, out: ModelOutput) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """labels: class indices, (B,) per input or (B, T) per token (-100 = no label)."""
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states, output_attentions)
        out.logits = self.head(self.features(out))
        if labels is not None:
            out.loss = token_loss(out.logits, labels)
        return out


class EncoderForSequenceClassification(EncoderWithHead):
    """One label per input from the pooled [CLS] vector. logits (B, num_labels)."""

    head_class = SequenceClassificationHead

    def features(self, out: ModelOutput) -> torch.Tensor:
        return out.pooled  # (B, D)


class EncoderForTokenClassification(EncoderWithHead):
    """One label per token (NER, POS tagging): labels (B, T), -100 on padding and non-first sub-words.
    logits (B, T, num_labels)."""

    head_class = TokenClassificationHead

    def features(self, out: ModelOutput) -> torch.Tensor:
        return out.last_hidden_state  # (B, T, D)
