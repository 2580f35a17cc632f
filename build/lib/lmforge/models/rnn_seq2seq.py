"""An RNN encoder-decoder with attention (Bahdanau et al. 2015; Luong et al. 2015), the model before the Transformer.

    encoder:   h_1..h_S = BiLSTM(E[x])                        h_j = [→h_j; ←h_j]  (d_hidden/2 per direction)
    bridge:    (s_0, c_0) = tanh(W_b [→h_S; ←h_1] + b_b)      every decoder layer's initial state
    decoder:   s_t = LSTM(s_{t-1}, [E[y_{t-1}]; h̃_{t-1}])     input feeding: the last attentional vector goes in
               c_t, α_t = Attention(s_t, h_1..h_S)             additive, general or dot (lmforge.nn.rnn_attention)
               h̃_t = tanh(W_c [c_t; s_t])                      Luong's attentional vector
    output:    p(y_t | y_<t, x) = softmax(W_o h̃_t)            W_o = E when tie_embeddings

The decoder follows Luong's order (attend with the *current* state s_t, then combine); Bahdanau's
additive score is Luong's "concat" score used in that order. The bridge reads the final states from the
memory itself (→h at each row's last real token, ←h at column 0), so ``decode`` needs only
``memory`` and ``src_mask``, like the Transformer's: the generation code treats both models alike.

Why the field moved on (seed 004, "a parallelizable encoder-decoder"): with input feeding, step t needs
h̃_{t-1}, so even teacher-forced training runs the decoder as a Python loop over the T target steps,
one small matmul after another; a Transformer decoder handles all T positions in one pass. With
``input_feeding=False`` the decoder LSTM runs fused over the whole sequence and attention is computed for
all steps at once, but the recurrence inside the LSTM is still sequential.

There are no positions: ``max_positions`` only caps source and generated lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models.common import IGNORE_INDEX, check_ids, check_length, padding_mask, token_loss
from lmforge.models.config import RNNSeq2SeqConfig
from lmforge.models.heads import LMHead
from lmforge.models.outputs import ModelOutput
from lmforge.nn.lstm import LSTM
from lmforge.nn.rnn_attention import make_attention


@dataclass
class DecoderState:
    """Everything one decoder step reads: the LSTM states, the fed-back vector and the source side.

    h, c: (L, B, H) per decoder layer; feed: (B, H) h̃_{t-1} (zeros before the first step);
    memory: (B, S, H) encoder states; keys: (B, S, D_k) their attention keys; mask: (B, S) True = real or None.
    """

    h: torch.Tensor
    c: torch.Tensor
    feed: torch.Tensor
    memory: torch.Tensor
    keys: torch.Tensor
    mask: torch.Tensor | None

    def reorder(self, index: torch.Tensor) -> DecoderState:
        """Keep (or repeat) batch rows ``index``: beam search's reordering and expansion."""
        rows = {f.name: getattr(self, f.name) for f in fields(self)}
        return DecoderState(**{
            name: None if value is None else value.index_select(1 if name in ("h", "c") else 0, index)
            for name, value in rows.items()
        })


class RNNDecoderCache:
    """The decoder's state between generation steps; ``Seq2SeqSteps`` calls ``reorder`` for beams.

    Empty until the first ``decode`` call, which fills it from the memory (bridge and attention keys).

    >>> cache = RNNDecoderCache()
    >>> cache.steps, cache.state is None
    (0, True)
    """

    def __init__(self) -> None:
        self.state: DecoderState | None = None
        self.steps = 0  # target tokens decoded so far

    def reorder(self, index: torch.Tensor) -> None:
        if self.state is not None:
            self.state = self.state.reorder(index)


def real_width(mask: torch.Tensor | None, width: int) -> int:
    """Columns up to the last one that is real in some row; ``width`` when there is no mask (or no real token).

    >>> real_width(torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]]), 4)
    2
    """
    if mask is None:
        return width
    columns = mask.bool().any(0).nonzero()  # (n, 1) real columns
    return int(columns.max()) + 1 if len(columns) else width


class RNNSeq2Seq(nn.Module):
    """BiLSTM encoder, attentional LSTM decoder with input feeding, shared (optionally tied) embeddings.

    Same interface as ``Seq2Seq``: ``encode``, ``decode`` (with or without a cache), ``forward``
    (teacher forcing, loss), ``new_caches``; ``lmforge.generation`` drives it unchanged.

    >>> from lmforge.models.config import get_preset
    >>> model = RNNSeq2Seq(get_preset("rnn-seq2seq-tiny")).eval()
    >>> out = model(torch.tensor([[5, 6, 7]]), torch.tensor([[1, 8]]), output_attentions=True)
    >>> out.logits.shape, out.cross_attentions[0].shape          # weights over the 3 source tokens
    (torch.Size([1, 2, 1000]), torch.Size([1, 1, 2, 3]))
    """

    def __init__(self, config: RNNSeq2SeqConfig) -> None:
        super().__init__()
        config.validate("RNNSeq2Seq")
        self.config = c = config
        e, h, layers = c.d_embed, c.d_hidden, c.n_decoder_layers
        self.embed = nn.Embedding(c.vocab_size, e)  # E: (V, E), source and target share one vocabulary
        self.drop = nn.Dropout(c.dropout)
        self.encoder = LSTM(e, h // 2, c.n_encoder_layers, bidirectional=True, dropout=c.dropout)
        self.bridge = nn.Linear(h, 2 * layers * h)  # W_b: [→h_S; ←h_1] -> (s_0, c_0) of every decoder layer
        self.decoder = LSTM(e + (h if c.input_feeding else 0), h, layers, dropout=c.dropout)
        self.attention = make_attention(c.attention, h, h)
        self.combine = nn.Linear(2 * h, h, bias=False)  # W_c: [c_t; s_t] -> h̃_t
        self.lm_head = LMHead(h, c.vocab_size)  # W_o: (V, H)
        nn.init.uniform_(self.embed.weight, -0.1, 0.1)  # Luong et al.'s uniform init for the embeddings
        if c.tie_embeddings:
            self.lm_head.tie(self.embed)

    # -- encoder -----------------------------------------------------------------------------------------
    def encode(
        self,
        src_ids: torch.Tensor,
        src_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """src_ids (B, S) right-padded, src_mask (B, S) 1 = real -> last_hidden_state = memory (B, S, H).

        Memory at padded positions is 0. ``hidden_states``: the embeddings and every encoder layer's output.
        """
        check_ids(src_ids, "src_ids")
        check_length(src_ids.shape[1], self.config.max_positions, "source")
        x = self.drop(self.embed(src_ids))  # (B, S, E)
        out = self.encoder(x, mask=src_mask)
        return ModelOutput(last_hidden_state=out.output,  # (B, S, H)
                           hidden_states=(x, *out.layers) if output_hidden_states else None)

    def initial_state(self, memory: torch.Tensor, src_mask: torch.Tensor | None) -> DecoderState:
        """The bridge: s_0, c_0 = tanh(W_b [→h_S; ←h_1] + b), read from the memory; keys computed once."""
        b, s, h = memory.shape
        mask = padding_mask(src_mask)
        last = (mask.sum(1) - 1).clamp(min=0) if mask is not None else torch.full((b,), s - 1, device=memory.device)
        forward_final = memory[torch.arange(b, device=memory.device), last, : h // 2]  # (B, H/2): →h at last token
        backward_final = memory[:, 0, h // 2:]  # (B, H/2): ←h after reading back to the first token
        z = torch.tanh(self.bridge(torch.cat([forward_final, backward_final], dim=-1)))  # (B, 2·L·H)
        s0, c0 = z.view(b, 2, self.config.n_decoder_layers, h).transpose(0, 2).unbind(1)  # (L, B, H) each
        return DecoderState(h=s0.contiguous(), c=c0.contiguous(), feed=memory.new_zeros(b, h), memory=memory,
                            keys=self.attention.keys(memory), mask=mask)

    # -- decoder -----------------------------------------------------------------------------------------
    def decode_steps(self, y: torch.Tensor, state: DecoderState) -> tuple[torch.Tensor, torch.Tensor, DecoderState]:
        """Embedded targets y (B, T, E) -> attentional vectors h̃ (B, T, H), weights α (B, T, S), new state."""
        if not self.config.input_feeding:  # no feedback: the LSTM runs fused over all T, attention in one go
            out = self.decoder(y, state=(state.h, state.c))
            top = out.output  # (B, T, H)
            context, weights = self.attention(top, state.memory, state.mask, keys=state.keys)  # (B, T, H)
            attentional = self.drop(torch.tanh(self.combine(torch.cat([context, top], dim=-1))))  # (B, T, H)
            new = DecoderState(out.h_n, out.c_n, attentional[:, -1], state.memory, state.keys, state.mask)
            return attentional, weights, new
        h, c, feed = list(state.h.unbind(0)), list(state.c.unbind(0)), state.feed
        outputs, alphas = [], []
        for t in range(y.shape[1]):  # the sequential dependency: step t needs h̃_{t-1}
            x = torch.cat([y[:, t], feed], dim=-1)  # (B, E + H): input feeding
            for layer, cell in enumerate(self.decoder.cells):
                h[layer], c[layer] = cell(self.decoder.drop(x) if layer else x, (h[layer], c[layer]))
                x = h[layer]  # (B, H)
            context, alpha = self.attention(x[:, None], state.memory, state.mask, keys=state.keys)  # (B, 1, H)
            feed = self.drop(torch.tanh(self.combine(torch.cat([context[:, 0], x], dim=-1))))  # (B, H): h̃_t
            outputs.append(feed)
            alphas.append(alpha)
        new = DecoderState(torch.stack(h), torch.stack(c), feed, state.memory, state.keys, state.mask)
        return torch.stack(outputs, dim=1), torch.cat(alphas, dim=1), new

    def decode(
        self,
        tgt_ids: torch.Tensor,
        memory: torch.Tensor | None,
        src_mask: torch.Tensor | None = None,
        tgt_mask: torch.Tensor | None = None,
        caches: list[RNNDecoderCache] | None = None,
        position_ids: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> ModelOutput:
        """tgt_ids (B, T) (only the new tokens with caches), memory (B, S, H) -> logits (B, T, V).

        Without a cache the decoder starts from the bridge; with one it continues from the cached state
        (the first call fills it from memory; memory may be None after). ``tgt_mask`` and ``position_ids``
        are accepted for the common interface and unused: the recurrence is causal by construction and
        right padding cannot reach earlier steps. ``cross_attentions`` = (α (B, 1, T, S),) on request;
        ``hidden_states`` = (target embeddings, attentional vectors h̃).
        """
        check_ids(tgt_ids, "tgt_ids")
        cache = caches[0] if caches else None
        past = cache.steps if cache is not None else 0
        check_length(past + tgt_ids.shape[1], self.config.max_positions, "target")
        if cache is not None and cache.state is not None:
            state = cache.state
        elif memory is None:
            raise LmforgeError("decode: memory is needed on the first step (the cache is empty)")
        else:
            state = self.initial_state(memory, src_mask)
        y = self.drop(self.embed(tgt_ids))  # (B, T, E)
        attentional, weights, state = self.decode_steps(y, state)
        if cache is not None:
            cache.state, cache.steps = state, past + tgt_ids.shape[1]
        return ModelOutput(
            logits=self.lm_head(attentional),  # (B, T, V)
            last_hidden_state=attentional,
            hidden_states=(y, attentional) if output_hidden_states else None,
            cross_attentions=(weights[:, None],) if output_attentions else None,
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

        Columns that are padding in every row (batches are padded to a fixed length) are skipped: the
        loop runs only to the longest target, attention only over the longest source. The logits keep
        the full (B, T, V) shape, 0 in the skipped columns. With ``output_attentions`` nothing is skipped.
        """
        width = tgt_ids.shape[1]
        if not output_attentions:
            s = real_width(src_mask, src_ids.shape[1])
            src_ids, src_mask = src_ids[:, :s], src_mask[:, :s] if src_mask is not None else None
            t = real_width(tgt_mask, width) if labels is None else max(
                real_width(tgt_mask, 1), real_width(labels != IGNORE_INDEX, 1))
            tgt_ids, tgt_mask = tgt_ids[:, :t], tgt_mask[:, :t] if tgt_mask is not None else None
        memory = self.encode(src_ids, src_mask).last_hidden_state
        out = self.decode(tgt_ids, memory, src_mask, tgt_mask, output_attentions=output_attentions)
        if tgt_ids.shape[1] < width:  # back to the batch's width: the skipped columns have no label
            out.logits = F.pad(out.logits, (0, 0, 0, width - tgt_ids.shape[1]))
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
    ) -> list[RNNDecoderCache]:
        """One cache for the whole decoder (its LSTM states grow no longer with the output: nothing to preallocate)."""
        check_length(max_len, self.config.max_positions, "cache")
        return [RNNDecoderCache()]
