"""GPT-2 (Radford et al. 2019): a decoder-only Transformer language model.

    h_0 = E[x] + P[pos]                               token + learned position embeddings, dropout
    h_l = TransformerLayer_l(h_{l-1})                 pre-LN, causal self-attention, tanh-GELU FFN
    logits = LN_f(h_L) Eᵀ                             final LayerNorm, LM head tied to E

Each layer is ``lmforge.nn.TransformerLayer(norm_position="pre", causal=True)``: the same layer the
encoder and the seq2seq model use, configured. With a KV cache (``new_caches``) a forward pass takes only
the new tokens and attends over everything cached: incremental decoding for generation.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lmforge.models.common import check_ids, check_length, init_weights, next_token_loss, padding_mask
from lmforge.models.config import DecoderConfig
from lmforge.models.heads import LMHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn import LayerCache, LearnedPositions, TransformerLayer


class Decoder(nn.Module):
    """GPT-2: token + learned positions, pre-LN causal layers, final LayerNorm, tied LM head.

    >>> from lmforge.models.config import get_preset
    >>> model = Decoder(get_preset("gpt-tiny")).eval()
    >>> model(torch.tensor([[1, 2, 3]])).logits.shape
    torch.Size([1, 3, 1000])
    """

    label_shift = 1  # the loss scores logits[:, :-1] against labels[:, 1:]: the trainer counts labels[:, 1:]

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)  # E: (V, D)
        self.pos_emb = LearnedPositions(c.max_positions, c.d_model)  # P: (max_positions, D)
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(c.d_model, c.n_heads, c.d_ff, norm_position="pre", activation=c.activation,
                             dropout=c.dropout, attention_dropout=c.attention_dropout, causal=True, eps=c.eps)
            for _ in range(c.n_layers)
        )
        self.norm_f = nn.LayerNorm(c.d_model, eps=c.eps)
        self.lm_head = LMHead(c.d_model, c.vocab_size)
        init_weights(self)
        # GPT-2 §2.3: residual projections scaled by 1/sqrt(N) for N residual additions (2 per layer).
        for layer in self.layers:
            for proj in (layer.self_attn.out_proj, layer.ffn.fc2):
                nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_embeddings:
            self.lm_head.tie(self.tok_emb)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        logits_to_keep: int = 0,
    ) -> ModelOutput:
        """input_ids (B, T): the new tokens (all of them without a cache).

        attention_mask: (B, S) 1/True for real tokens, covering cached + new positions (S = past + T).
        labels: (B, T) next-token targets, shifted inside (logits[:, :-1] vs labels[:, 1:]); -100 ignored.
        position_ids: (B, T) or (T,); default past + arange(T) (pass them for left-padded prompts).
        caches: from ``new_caches``; each layer's keys/values are appended in place.
        logits_to_keep: n > 0 computes the logits of the last n positions only, (B, n, V): after a prompt
            generation needs one row, not a (B, T, V) tensor of which it keeps ``[:, -1]``.
        hidden_states follow Hugging Face: (embeddings, layer 1, ..., layer L-1, LN_f(layer L)).
        """
        check_ids(input_ids)
        t = input_ids.shape[1]
        past = caches[0].self_attention.length if caches else 0
        check_length(past + t, self.config.max_positions)
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device)  # (T,)
        mask = padding_mask(attention_mask)  # (B, S) or None

        h = self.drop(self.tok_emb(input_ids) + self.pos_emb(position_ids))  # (B, T, D)
        hidden: list[torch.Tensor] = [h]
        attentions: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            out = layer(h, key_padding_mask=mask, need_weights=output_attentions,
                        cache=caches[i] if caches else None)
            h = out.hidden
            hidden.append(h)
            if output_attentions:
                attentions.append(out.self_attention)
        h = self.norm_f(h)  # (B, T, D)
        hidden[-1] = h
        logits = self.lm_head(h[:, -logits_to_keep:] if logits_to_keep else h)  # (B, T, V) or (B, n, V)
        loss = next_token_loss(logits, labels) if labels is not None else None
        return ModelOutput(
            logits=logits,
            loss=loss,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            last_hidden_state=h,
        )

    def new_caches(
        self, batch: int, max_len: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerCache]:
        """Empty per-layer KV caches for up to max_len positions (prompt + generated)."""
        check_length(max_len, self.config.max_positions, "cache")
        weight = self.tok_emb.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        return [layer.new_cache(batch, max_len, 0, dtype, device) for layer in self.layers]
