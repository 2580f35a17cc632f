"""The Transformer of Vaswani et al. (2017): an encoder-decoder for sequence-to-sequence tasks.

    encoder:  x_0 = sqrt(d) E[src] + PE        x_l = EncoderLayer_l(x_{l-1})          memory = x_N
    decoder:  y_0 = sqrt(d) E[tgt] + PE        y_l = DecoderLayer_l(y_{l-1}, memory)  logits = y_N Eᵀ

Both stacks are ``lmforge.nn.TransformerLayer`` with post-LN and ReLU (§3.1, §3.3); the decoder's layers
are causal and add cross-attention over the memory. One embedding matrix E is shared by the source,
the target and the pre-softmax projection (§3.4); PE are the fixed sinusoids (§3.5).
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.models.common import check_ids, check_length, padding_mask, token_loss
from lmforge.models.config import Seq2SeqConfig
from lmforge.models.heads import LMHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn import LayerCache, SinusoidalPositions, TransformerLayer, scale_embedding


class Seq2Seq(nn.Module):
    """Encoder-decoder Transformer with shared, tied embeddings.

    >>> from lmforge.models.config import get_preset
    >>> model = Seq2Seq(get_preset("seq2seq-tiny")).eval()
    >>> model(torch.tensor([[5, 6, 7]]), torch.tensor([[1, 8]])).logits.shape
    torch.Size([1, 2, 1000])
    """

    def __init__(self, config: Seq2SeqConfig) -> None:
        super().__init__()
        self.config = config
        c = config

        def layer(decoder: bool) -> TransformerLayer:
            return TransformerLayer(c.d_model, c.n_heads, c.d_ff, norm_position="post", activation=c.activation,
                                    dropout=c.dropout, attention_dropout=c.attention_dropout, eps=c.eps,
                                    causal=decoder, cross_attention=decoder)

        self.embed = nn.Embedding(c.vocab_size, c.d_model)  # E: (V, D), shared three ways
        self.positions = SinusoidalPositions(c.max_positions, c.d_model)
        self.scale = scale_embedding(c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.encoder_layers = nn.ModuleList(layer(decoder=False) for _ in range(c.n_encoder_layers))
        self.decoder_layers = nn.ModuleList(layer(decoder=True) for _ in range(c.n_decoder_layers))
        self.lm_head = LMHead(c.d_model, c.vocab_size)
        for name, p in self.named_parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        nn.init.normal_(self.embed.weight, mean=0.0, std=c.d_model**-0.5)  # sqrt(d) E has unit scale
        self.lm_head.tie(self.embed)

    def embed_tokens(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.drop(self.embed(ids) * self.scale + self.positions(positions))  # (B, T, D)

    def encode(
        self,
        src_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """src_ids (B, S), src_mask (B, S) 1 = real token -> last_hidden_state = memory (B, S, D)."""
        check_ids(src_ids, "src_ids")
        check_length(src_ids.shape[1], self.config.max_positions, "source")
        mask = padding_mask(src_mask)
        x = self.embed_tokens(src_ids, torch.arange(src_ids.shape[1], device=src_ids.device))
        hidden, attentions = [x], []
        for layer in self.encoder_layers:
            out = layer(x, key_padding_mask=mask, need_weights=output_attentions)
            x = out.hidden
            hidden.append(x)
            attentions.append(out.self_attention)
        return ModelOutput(
            last_hidden_state=x,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor | None,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        caches: list[LayerCache] | None = None,
        position_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """tgt_ids (B, T) (only the new tokens with caches), memory (B, S, D) -> logits (B, T, V).

        tgt_mask: (B, T_total) 1 = real target token, covering cached + new positions.
        With caches, the cross-attention keys/values are computed from memory on the first call and
        reused after (memory may then be None).
        """
        check_ids(tgt_ids, "tgt_ids")
        past = caches[0].self_attention.length if caches else 0
        t = tgt_ids.shape[1]
        check_length(past + t, self.config.max_positions, "target")
        if position_ids is None:
            position_ids = torch.arange(past, past + t, device=tgt_ids.device)
        y = self.embed_tokens(tgt_ids, position_ids)
        src, tgt = padding_mask(src_mask), padding_mask(tgt_mask)
        hidden, attentions, cross = [y], [], []
        for i, layer in enumerate(self.decoder_layers):
            out = layer(y, memory, key_padding_mask=tgt, memory_padding_mask=src, need_weights=output_attentions,
                        cache=caches[i] if caches else None)
            y = out.hidden
            hidden.append(y)
            attentions.append(out.self_attention)
            cross.append(out.cross_attention)
        return ModelOutput(
            logits=self.lm_head(y),  # (B, T, V)
            last_hidden_state=y,
            hidden_states=tuple(hidden) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            cross_attentions=tuple(cross) if output_attentions else None,
        )

    def forward(
        self,
        src_ids: torch.Tensor,
        tgt_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> ModelOutput:
        """Teacher forcing: tgt_ids = [bos] + y[:-1], labels = y (same positions, -100 ignored).

        attentions / cross_attentions are the decoder's; ``encode`` returns the encoder's.
        """
        memory = self.encode(src_ids, src_mask).last_hidden_state
        out = self.decode(tgt_ids, memory, src_mask, tgt_mask, output_attentions=output_attentions)
        if labels is not None:
            out.loss = token_loss(out.logits, labels, self.config.label_smoothing if self.training else 0.0)
        return out

    def new_caches(
        self,
        batch: int,
        max_len: int,
        memory_len: int,
        dtype: torch.dtype | None = None,
        device: torch.device | None = None,
    ) -> list[LayerCache]:
        """Per decoder layer: a self-attention cache of max_len and a cross-attention cache of memory_len."""
        check_length(max_len, self.config.max_positions, "cache")
        weight = self.embed.weight
        dtype, device = dtype or weight.dtype, device or weight.device
        return [layer.new_cache(batch, max_len, memory_len, dtype, device) for layer in self.decoder_layers]
