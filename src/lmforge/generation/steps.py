"""Feeding a model one step at a time: the part of generation that knows about models and caches.

A *stepper* hides the difference between a decoder-only model (GPT) and an encoder-decoder (Vaswani):

    logits = steps.first()        # (B, V): run the prompt (or encode the source) and score the next token
    logits = steps.next(tokens)   # (B, V): append tokens (B,) and score the token after them
    steps.reorder(index)          # keep rows ``index`` (beam search), or repeat rows to expand a batch

With the KV cache (default) each ``next`` runs the model on one new token per row and attends over
the cached keys and values: O(t) work at step t. Without it (``use_cache=False``) each step re-runs
the whole prefix, O(t²): slower, but the plain definition of the model, against which the cache is
tested.

Left padding. Prompts of different lengths are padded on the left so that every row's next token goes
in the same column. Padded keys are masked out, and positions count real tokens only, so a padded
row computes exactly what the same prompt computes alone:

    attention_mask  [0, 0, 1, 1, 1]
    position_ids    [0, 0, 0, 1, 2]        = max(cumsum(mask) - 1, 0)
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.requests import check_room
from lmforge.models.interfaces import is_encoder_decoder, special_ids
from lmforge.nn.layers import LayerCache

if TYPE_CHECKING:
    from lmforge.generation.runners.eager import EagerRunner


def reorder_caches(caches: list, index: torch.Tensor) -> None:
    """Keep (or repeat) batch rows ``index`` of every layer's self- and cross-attention cache."""
    for cache in caches:
        if isinstance(cache, LayerCache):
            cache.self_attention.reorder(index)
            if cache.cross_attention is not None:
                cache.cross_attention.reorder(index)
        else:
            cache.reorder(index)


def padding_positions(mask: torch.Tensor) -> torch.Tensor:
    """Positions of a left-padded batch, counting real tokens only.

    >>> padding_positions(torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])).tolist()
    [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    """
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def move_padding_right(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Real tokens first, in their order, then the padding: for encoders that number positions from 0.

    Left-padded (or already right-padded) rows both come out right-padded:

    >>> ids, mask = torch.tensor([[0, 0, 7, 8], [5, 6, 0, 0]]), torch.tensor([[0, 0, 1, 1], [1, 1, 0, 0]])
    >>> ids, mask = move_padding_right(ids, mask)
    >>> ids.tolist(), mask.tolist()
    ([[7, 8, 0, 0], [5, 6, 0, 0]], [[1, 1, 0, 0], [1, 1, 0, 0]])
    """
    is_pad = (mask == 0).to(torch.uint8)  # (B, S) 0 for real tokens, 1 for padding
    order = torch.sort(is_pad, dim=1, stable=True).indices  # (B, S) real columns first, order kept
    return ids.gather(1, order), mask.gather(1, order)


def reset_caches(caches: list) -> None:
    """Empty every layer's caches, keeping their buffers (to run another batch of the same shape)."""
    for cache in caches:
        cache.self_attention.reset()
        if cache.cross_attention is not None:
            cache.cross_attention.reset()


def accepts(fn, name: str) -> bool:
    """Whether ``fn`` takes a keyword ``name`` (models written before an option was added do not)."""
    return name in inspect.signature(fn).parameters


class Steps:
    """What both steppers share: a buffer of tokens so far, and a step that feeds the newest token.

    Subclasses set ``ids`` (B, total), ``length`` and ``use_cache`` and implement ``run(start)``: run the
    model on columns [start, length) and return the logits of the last column (B, V).
    """

    ids: torch.Tensor
    length: int
    use_cache: bool

    def run(self, start: int) -> torch.Tensor:
        raise NotImplementedError

    def first(self) -> torch.Tensor:
        """Logits after the prompt (decoder) or the start token (encoder-decoder)."""
        return self.run(0)

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append one token per row (B,) and return the logits that follow it (B, V)."""
        self.ids[:, self.length] = tokens
        self.length += 1
        return self.run(self.length - 1 if self.use_cache else 0)


class DecoderSteps(Steps):
    """Steps of a decoder-only model: the prompt once, then one token per row per step.

    ``input_ids`` (B, P) is the (left-padded) prompt, ``attention_mask`` (B, P) 1 for real tokens.
    Without padding no mask and no positions are passed, so the model takes its fastest path.
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        max_new_tokens: int,
        use_cache: bool = True,
        caches: list[LayerCache] | None = None,
    ) -> None:
        self.model = model
        b, p = input_ids.shape
        total = p + max_new_tokens
        max_positions = getattr(getattr(model, "config", None), "max_positions", None)
        if max_positions is not None:
            check_room(p, max_new_tokens, max_positions)
        self.use_cache = use_cache
        self.length = p  # tokens so far per row, padding included
        self.padded = attention_mask is not None and not bool(attention_mask.all())
        device = input_ids.device
        self.ids = torch.empty(b, total, dtype=torch.long, device=device)  # prompt + generated, (B, P + N)
        self.ids[:, :p] = input_ids
        self.mask = self.positions = None
        if self.padded:
            self.mask = torch.ones(b, total, dtype=torch.long, device=device)  # (B, P + N)
            self.mask[:, :p] = attention_mask
            self.positions = padding_positions(self.mask)  # (B, P + N): new tokens continue each row
        if caches is not None:  # given (to reuse their buffers): emptied first
            reset_caches(caches)
        self.caches = (caches or model.new_caches(b, total, device=device)) if use_cache else None
        self.last_only = {"logits_to_keep": 1} if accepts(model.forward, "logits_to_keep") else {}

    def run(self, start: int) -> torch.Tensor:
        """Run the model on columns [start, length) (start = 0: the whole prefix); logits of the last."""
        end = self.length
        mask = self.mask[:, :end] if self.padded else None  # covers cached and new keys
        positions = self.positions[:, start:end] if self.padded else None  # None: cache length + arange
        out = self.model(self.ids[:, start:end], attention_mask=mask, position_ids=positions, caches=self.caches,
                         **self.last_only)  # the prompt: the last position's logits only, not (B, P, V)
        return out.logits[:, -1]  # (B, V)

    def reorder(self, index: torch.Tensor) -> None:
        self.ids = self.ids.index_select(0, index)
        if self.padded:
            self.mask, self.positions = self.mask.index_select(0, index), self.positions.index_select(0, index)
        if self.caches is not None:
            reorder_caches(self.caches, index)


class Seq2SeqSteps(Steps):
    """Steps of an encoder-decoder: encode the source once, then decode from ``start_id`` a token at a time.

    ``input_ids`` (B, S) is the source, ``attention_mask`` (B, S) 1 for real tokens; left-padded sources
    are moved to right padding, since the encoder's positions count from column 0. The encoder output
    (the memory) is computed once; with the cache, each layer's cross-attention keys and values are
    projected from it on the first step and reused after.
    """

    def __init__(
        self,
        model: nn.Module,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        max_new_tokens: int,
        use_cache: bool = True,
        start_id: int = 0,
        caches: list[LayerCache] | None = None,
    ) -> None:
        self.model = model
        b, s = input_ids.shape
        total = 1 + max_new_tokens
        max_positions = getattr(getattr(model, "config", None), "max_positions", None)
        if max_positions is not None:  # the target: a start token and the new tokens; the source apart
            check_room(1, max_new_tokens, max_positions)
            if s > max_positions:
                raise LmforgeError(f"prompt: the source is {s} tokens, the context {max_positions}: shorten it")
        self.use_cache = use_cache
        if attention_mask is not None:  # the encoder numbers positions from column 0: real tokens go first
            input_ids, attention_mask = move_padding_right(input_ids, attention_mask)
        self.src_mask = attention_mask
        self.memory = model.encode(input_ids, attention_mask).last_hidden_state  # (B, S, D)
        self.ids = torch.full((b, total), start_id, dtype=torch.long, device=input_ids.device)  # (B, 1 + N)
        self.length = 1
        if caches is not None:
            reset_caches(caches)
        self.caches = (caches or model.new_caches(b, total, s, device=input_ids.device)) if use_cache else None

    def run(self, start: int) -> torch.Tensor:
        out = self.model.decode(self.ids[:, start:self.length], self.memory, src_mask=self.src_mask,
                                caches=self.caches)
        return out.logits[:, -1]  # (B, V)

    def reorder(self, index: torch.Tensor) -> None:
        self.ids = self.ids.index_select(0, index)
        self.memory = self.memory.index_select(0, index)
        if self.src_mask is not None:
            self.src_mask = self.src_mask.index_select(0, index)
        if self.caches is not None:
            reorder_caches(self.caches, index)


def make_steps(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_new_tokens: int,
    use_cache: bool = True,
    start_id: int | None = None,
    caches: list[LayerCache] | None = None,
) -> DecoderSteps | Seq2SeqSteps:
    """The stepper that fits ``model``: ``Seq2SeqSteps`` for encoder-decoders, else ``DecoderSteps``.

    caches: reuse these (emptied) instead of allocating new ones; they must fit the batch and lengths.
    """
    if is_encoder_decoder(model):
        start_id = special_ids(model, start=start_id).decoder_start  # none: one line naming it
        return Seq2SeqSteps(model, input_ids, attention_mask, max_new_tokens, use_cache, start_id, caches)
    return DecoderSteps(model, input_ids, attention_mask, max_new_tokens, use_cache, caches)


class SlotSteps:
    """Beam search's stepper (``first`` / ``next`` / ``reorder``) over a runner's slots (generation/runners/).

    The B prompts are prefilled into slots [0, B); ``reorder`` copies slot rows (B -> B*K beams at the first
    step, then the surviving hypotheses); ``next`` is the runner's step: the same calls (and compiled graphs) as
    ``generate``'s.
    """

    def __init__(self, runner: EagerRunner, prompts: list[list[int]]) -> None:
        self.runner, self.prompts = runner, prompts
        self.lengths: list[int] = []
        self.sources: list[int] = []

    def first(self) -> torch.Tensor:
        r, rows = self.runner, []
        with torch.inference_mode():
            for i, ids in enumerate(self.prompts):
                rows.append(r.prefill([i], [ids]))
                self.lengths.append(1 if r.seq2seq else len(ids))
                self.sources.append(len(ids))
        return torch.cat(rows)  # (B, V)

    def reorder(self, index: torch.Tensor) -> None:
        picked = index.tolist()
        self.runner.reorder(index)
        self.lengths = [self.lengths[j] for j in picked]
        self.sources = [self.sources[j] for j in picked]

    def next(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (R,) -> the logits that follow them (R, V)."""
        with torch.inference_mode():
            logits = self.runner.step(tokens.tolist(), self.lengths, self.sources)
        self.lengths = [n + 1 for n in self.lengths]
        return logits
