"""GPT-2 (Radford et al. 2019): a decoder-only Transformer language model, and its modern variants.

    h_0 = E[x] + P[pos]                               token + learned position embeddings, dropout
    h_l = TransformerLayer_l(h_{l-1})                 pre-LN, causal self-attention, tanh-GELU FFN
    logits = LN_f(h_L) Eᵀ                             final LayerNorm, LM head tied to E

Each layer is ``lmforge.nn.TransformerLayer(norm_position="pre", causal=True)``: the same layer the
encoder and the seq2seq model use, configured. With a KV cache (``new_caches``) a forward pass takes only
the new tokens and attends over everything cached: incremental decoding for generation.

The ``DecoderConfig`` switches turn the same class into the modern recipe (docs/modern.md): with
``positions="rotary"`` there is no table P (each layer rotates its queries and keys instead), with
``tie_embeddings=False`` the head has its own W_out, with ``n_kv_heads`` < ``n_heads`` the attention is
grouped-query (the Llama family: ``lmforge.interop.llama``), and with ``logit_softcap=c``

    logits = c · tanh(LN_f(h_L) W_outᵀ / c)           each logit bounded to (-c, c)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.models.common import (
    IGNORE_INDEX,
    check_ids,
    check_length,
    init_weights,
    next_token_loss,
    padding_mask,
)
from lmforge.models.config import DecoderConfig
from lmforge.models.heads import LMHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn import LayerCache, LearnedPositions, RotaryEmbedding, TransformerLayer, make_norm
from lmforge.nn.loss import LOSS_CHUNK_ROWS, chunked_token_loss


def soft_cap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """c · tanh(z / c): close to z for |z| << c, never beyond ±c (Gemma 2, the nanoGPT speedrun)."""
    return cap * torch.tanh(logits / cap)


class Decoder(nn.Module):
    """GPT-2: token + learned positions, pre-LN causal layers, final LayerNorm, tied LM head.

    Or, by its config's switches, a modern decoder: RMSNorm, rotary positions, QK-norm, ReLU² or SwiGLU,
    no biases, an untied and soft-capped head, zero-initialised output projections.

    >>> from lmforge.models.config import get_preset
    >>> model = Decoder(get_preset("gpt-tiny")).eval()
    >>> model(torch.tensor([[1, 2, 3]])).logits.shape
    torch.Size([1, 3, 1000])
    """

    label_shift = 1  # the loss scores logits[:, :-1] against labels[:, 1:]: the trainer counts labels[:, 1:]
    loss_chunk_rows = LOSS_CHUNK_ROWS  # loss_only: the LM head runs on at most this many positions at a time

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.tok_emb = nn.Embedding(c.embedding_rows, c.d_model)  # E: (V, D), V padded to vocab_multiple
        rotary = c.positions == "rotary"
        # P: (max_positions, D) added to E[x]; or one rotation table shared by every layer's attention
        self.pos_emb = None if rotary else LearnedPositions(c.max_positions, c.d_model)
        self.rotary = RotaryEmbedding(c.d_model // c.n_heads, c.max_positions, c.rope_base) if rotary else None
        self.drop = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(
            TransformerLayer(c.d_model, c.n_heads, c.d_ff, norm_position="pre", activation=c.activation,
                             dropout=c.dropout, attention_dropout=c.attention_dropout, causal=True, eps=c.eps,
                             bias=c.bias, rotary=self.rotary, norm=c.norm, qk_norm=c.qk_norm, n_kv_heads=c.n_kv_heads)
            for _ in range(c.n_layers)
        )
        self.norm_f = make_norm(c.norm, c.d_model, c.eps, c.bias)
        self.lm_head = LMHead(c.d_model, c.embedding_rows)
        init_weights(self)
        # GPT-2 §2.3: residual projections scaled by 1/sqrt(N) for N residual additions (2 per layer).
        # Zero-init instead (the nanoGPT speedrun): every layer starts as the identity on the residual stream.
        for layer in self.layers:
            for proj in (layer.self_attn.out_proj, layer.ffn.fc2):
                if c.zero_init_projections:
                    nn.init.zeros_(proj.weight)
                else:
                    nn.init.normal_(proj.weight, mean=0.0, std=0.02 / math.sqrt(2 * c.n_layers))
        if c.tie_embeddings:
            self.lm_head.tie(self.tok_emb)
        elif c.zero_init_projections:  # an untied head starting at 0: uniform predictions at step 0
            nn.init.zeros_(self.lm_head.proj.weight)

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
        logit_positions: torch.Tensor | None = None,
        segment_ids: torch.Tensor | None = None,
        loss_only: bool = False,
    ) -> ModelOutput:
        """input_ids (B, T): the new tokens (all of them without a cache).

        attention_mask: (B, S) 1/True for real tokens, covering cached + new positions (S = past + T).
        labels: (B, T) next-token targets, shifted inside (logits[:, :-1] vs labels[:, 1:]); -100 ignored.
        position_ids: (B, T) or (T,); default past + arange(T) (pass them for left-padded prompts).
        caches: from ``new_caches``; each layer's keys/values are appended in place.
        logits_to_keep: n > 0 computes the logits of the last n positions only, (B, n, V): after a prompt
            generation needs one row, not a (B, T, V) tensor of which it keeps ``[:, -1]``.
        logit_positions: (B,) the one position of each row whose logits to compute, (B, 1, V): the last real
            token of a right-padded prompt (the decoding engine's prefill).
        segment_ids: (B, T) which packed sequence each position belongs to (data/chat.py): a position attends only
            within its own segment (block-diagonal causal attention); pass position_ids restarting per segment.
        loss_only: with labels, compute the logits of the N positions that have a target only, (N, V): the same
            loss, and the LM head's work (V columns a position) shrinks to what is scored (instruction tuning
            labels only the assistant's tokens). Over ``loss_chunk_rows`` targets the head and the loss run in
            chunks of that many rows (nn/loss.py) and no logits are returned. Metrics that need (B, T, V) get none.
        hidden_states follow Hugging Face: (embeddings, layer 1, ..., layer L-1, LN_f(layer L)).
        """
        check_ids(input_ids)
        t = input_ids.shape[1]
        past = caches[0].self_attention.length if caches else 0
        check_length(past + t, self.config.max_positions)
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=input_ids.device)  # (T,)
        mask = padding_mask(attention_mask)  # (B, S) or None
        blocks = None
        if segment_ids is not None:  # (B, 1, T, T): same segment only; the layers add the causal triangle
            blocks = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]

        h = self.tok_emb(input_ids)  # (B, T, D)
        if self.pos_emb is not None:
            h = h + self.pos_emb(position_ids)
        h = self.drop(h)
        hidden: list[torch.Tensor] = [h]
        attentions: list[torch.Tensor] = []
        # the rotation angles of the positions, looked up once for every layer
        rotary_positions = self.rotary.angles(position_ids, h.dtype) if self.rotary is not None else None
        for i, layer in enumerate(self.layers):
            out = layer(h, key_padding_mask=mask, attn_mask=blocks, need_weights=output_attentions,
                        cache=caches[i] if caches else None, positions=rotary_positions)
            h = out.hidden
            hidden.append(h)
            if output_attentions:
                attentions.append(out.self_attention)
        h = self.norm_f(h)  # (B, T, D)
        hidden[-1] = h
        if loss_only and labels is not None:  # (N, D): the positions whose next token is a target
            targets = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)  # (B, T) the target of each position
            scored_at = targets != IGNORE_INDEX  # (B, T)
            # (N, V) logits, or None when N is over loss_chunk_rows: the head then runs chunk by chunk
            logits, loss = chunked_token_loss(self.head, h[scored_at], targets[scored_at], self.loss_chunk_rows)
        else:
            logits = self.head(self.scored_positions(h, logits_to_keep, logit_positions))  # (B, T | n | 1, V)
            loss = next_token_loss(logits, labels) if labels is not None else None
        return ModelOutput(
            logits=logits,
            loss=loss,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            last_hidden_state=h,
        )

    def scored_positions(self, h: torch.Tensor, logits_to_keep: int,
                         logit_positions: torch.Tensor | None) -> torch.Tensor:
        """The hidden states whose logits are wanted: all (B, T, D), the last n (B, n, D) or one per row (B, 1, D)."""
        if logit_positions is not None:  # (B, 1, D): row b's hidden state at logit_positions[b]
            return h.gather(1, logit_positions.view(-1, 1, 1).expand(-1, 1, h.shape[-1]))
        return h[:, -logits_to_keep:] if logits_to_keep else h

    def head(self, h: torch.Tensor) -> torch.Tensor:
        """Logits (..., V) of hidden states (..., D): the LM head, the padded vocabulary rows dropped, the soft cap."""
        logits = self.lm_head(h)
        if logits.shape[-1] != self.config.vocab_size:  # padded rows (vocab_multiple) are never a token
            logits = logits[..., : self.config.vocab_size]
        if self.config.logit_softcap is not None:
            logits = soft_cap(logits, self.config.logit_softcap)
        return logits

    def new_caches(
        self, batch: int, max_len: int, dtype: torch.dtype | None = None, device: torch.device | None = None
    ) -> list[LayerCache]:
        """Empty per-layer KV caches for up to max_len positions (prompt + generated)."""
        check_length(max_len, self.config.max_positions, "cache")
        weight = next(p for p in self.parameters() if p.is_floating_point())  # a quantized model's embedding has none
        dtype, device = dtype or weight.dtype, device or weight.device
        return [layer.new_cache(batch, max_len, 0, dtype, device) for layer in self.layers]
