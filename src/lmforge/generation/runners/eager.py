"""The eager runner: the arithmetic of decoding over slots, written plainly. The reference every other runner is
tested against, and what docs/generation.md explains.

A runner owns the model's side of the engine: the caches of its slots (``slots.SlotCaches``), each slot's
sampling settings and random stream, and the two model calls:

    logits = runner.prefill(slots, prompts, start)     (B, V): prompts written into their slots' caches
    logits = runner.step(tokens, lengths, sources)     (R, V): one new token for each of rows [0, R)
    tokens = runner.choose(logits, slots)              each row by its own slot's settings

The scheduler (scheduler.py) decides which slots run; the runner never decides, it computes. A runner's shapes
come from *buckets* (slots.py): prompts padded to a multiple of 8 tokens, columns read to a multiple of 32, rows
exactly the rows in use. Other runners change how the same calls are made (cpu.py: packed products, a thread
policy and the lean step of generation/lean.py; compiled.py: a graph per bucket), never what they compute.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
from torch import nn

from lmforge.generation.adapters import selector_of
from lmforge.generation.constraints import RowConstraints
from lmforge.generation.prefix import PrefixCache
from lmforge.generation.requests import Generation, Request
from lmforge.generation.sampling import draw
from lmforge.generation.slots import SlotCaches, bucket, multiples, upload
from lmforge.models.interfaces import is_encoder_decoder

Arrivals = list[tuple[int, Generation]]


# -- the model calls: plain functions of (model, caches, tensors), which a compiler may specialise per bucket -------
def decoder_prefill(model: nn.Module, caches: list, ids: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """ids (B, P_b) right-padded, last (B,) -> the next-token logits after each row's last real token (B, V)."""
    return model(ids, caches=caches, logit_positions=last).logits[:, -1]


def decoder_step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor,
                 capacity: int) -> torch.Tensor:
    """tokens (R,) at positions lengths (R,) -> next-token logits (R, V); row b sees its columns <= lengths[b]."""
    visible = torch.arange(capacity, device=tokens.device)[None, :] <= lengths[:, None]  # (R, C_b)
    out = model(tokens[:, None], attention_mask=visible, position_ids=lengths[:, None], caches=caches)
    return out.logits[:, -1]


def seq2seq_prefill(model: nn.Module, caches: list, src: torch.Tensor, src_mask: torch.Tensor,
                    start: torch.Tensor) -> torch.Tensor:
    """Encode the source (1, S_b) once, fill the cross-attention cache, decode the start token -> (1, V)."""
    memory = model.encode(src, src_mask).last_hidden_state  # (1, S_b, D)
    positions = torch.zeros_like(start)
    return model.decode(start, memory, src_mask=src_mask, caches=caches, position_ids=positions).logits[:, -1]


def seq2seq_step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor, capacity: int,
                 src_mask: torch.Tensor) -> torch.Tensor:
    """One target token per row, attending to its own target columns and its own source (R, M_b)."""
    visible = torch.arange(capacity, device=tokens.device)[None, :] <= lengths[:, None]  # (R, C_b)
    out = model.decode(tokens[:, None], None, src_mask=src_mask, tgt_mask=visible, caches=caches,
                       position_ids=lengths[:, None])
    return out.logits[:, -1]


def shifts(r: Request) -> bool:
    """Whether a request moves its logits by OpenAI's bias or penalties."""
    return bool(r.logit_bias or r.presence_penalty or r.frequency_penalty)


class EagerRunner:
    """The model's side of an engine of ``slots`` slots holding ``capacity`` tokens each (an encoder-decoder's
    sources up to ``memory``); ``start_id``: an encoder-decoder's first target token; ``prefix_blocks``: blocks
    of prompt beginnings kept for reuse (prefix.py; decoders); ``kv_dtype``: the caches' (default the model's; a
    float16 cache rounds each key and value once, slots.py)."""

    name = "eager"
    spare_columns = 0  # columns allocated beyond the capacity (cpu.py's one graph wants one spare bucket)

    def __init__(self, model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                 prefix_blocks: int = 0, pad_id: int = 0, kv_dtype: torch.dtype | None = None) -> None:
        self.model, self.capacity, self.start_id, self.pad_id = model.eval(), capacity, start_id, pad_id
        self.seq2seq = is_encoder_decoder(model)
        self.memory = memory if self.seq2seq else 0
        self.device = next(model.parameters()).device
        self.row_buckets = self.rows_for(slots)
        self.n_slots = self.slots_for(slots)
        self.capacity_buckets, self.prompt_buckets = self.columns_for(capacity, self.memory or capacity)
        s = self.row_buckets[-1]  # rows a step may compute: the slots, and any a bucket adds (never held)
        self.caches = SlotCaches(model, s, capacity + self.spare_columns, self.memory, kv_dtype)
        vocab = model.config.vocab_size
        self.seen = torch.zeros(s, vocab, dtype=torch.bool, device=self.device)  # (S, V) tokens in each text
        self.src_mask = torch.zeros(s, max(self.memory, 1), dtype=torch.bool, device=self.device)  # (S, M)
        self.settings = torch.zeros(4, s, device=self.device)  # rows: temperature, top_k, top_p, penalty
        self.settings[2:] = 1.0
        self.shift = torch.zeros(s, vocab, device=self.device)  # (S, V) added to the logits: OpenAI's bias, penalties
        self.generated: list[set[int]] = [set() for _ in range(s)]  # each slot's tokens generated yet (host)
        self.generators: list[torch.Generator | None] = [None] * s
        self.requests: list[Request | None] = [None] * s
        self.constraints = RowConstraints(s, vocab)  # each slot's grammar state (constraints.py; None: free)
        self.selector = selector_of(model)  # several LoRA adapters over the model (adapters.py), or None
        self.adapter_of = torch.zeros(s, dtype=torch.long, device=self.device)  # (S,) each slot's adapter, 0: none
        self.prefix = PrefixCache(self.caches, prefix_blocks) if prefix_blocks and self.keeps_prefixes() else None
        self.prefill_fn, self.step_fn = (seq2seq_prefill, seq2seq_step) if self.seq2seq else \
            (decoder_prefill, decoder_step)
        self.plain_step_fn = self.step_fn  # the step of chosen rows (a failed step retried one by one): never compiled

    # -- shapes (other runners choose other buckets) ----------------------------------------------------------------
    def rows_for(self, slots: int) -> list[int]:
        """The row counts a step may compute: every count up to the slots (each row computed is a request)."""
        return list(range(1, slots + 1))

    def slots_for(self, slots: int) -> int:
        """The slots requests may hold: every row a step may compute (cpu.py keeps a spare row)."""
        return self.row_buckets[-1]

    def columns_for(self, capacity: int, longest_prompt: int) -> tuple[list[int], list[int]]:
        """(columns a step reads, widths a prompt is padded to): multiples of 32 and of 8."""
        return multiples(32, capacity), multiples(8, longest_prompt)

    def keeps_prefixes(self) -> bool:
        return not self.seq2seq

    def describe(self) -> str:
        """One line for the log: which runner, which shapes."""
        rows = self.row_buckets
        row_text = f"rows {rows[0]}-{rows[-1]}" if rows == list(range(rows[0], rows[-1] + 1)) else f"rows {rows}"
        return (f"{self.name} runner on {self.device}: {self.n_slots} slots of {self.capacity} tokens; steps of "
                f"{row_text} reading {len(self.capacity_buckets)} column widths, prompts in "
                f"{len(self.prompt_buckets)} widths" + (f"; prefix cache of {self.prefix.capacity} blocks"
                                                       if self.prefix else "") + self.caches.describe())

    def warmup(self) -> int:
        """Graphs compiled before the first request: none here (compiled runners override)."""
        return 0

    # -- a slot's own state ---------------------------------------------------------------------------------------
    def begin(self, i: int, request: Request) -> None:
        """Slot i's sampling settings, random stream and (with a repetition penalty) the tokens of its text."""
        r, last = request, self.requests[i]
        self.requests[i] = r
        self.generators[i] = r.generator or (torch.Generator(self.device).manual_seed(r.seed)
                                             if r.seed is not None else None)
        upload([r.temperature, r.top_k or 0, r.top_p or 1.0, r.repetition_penalty], self.device, torch.float32,
               out=self.settings[:, i])
        if r.repetition_penalty != 1.0:  # the tokens of the text so far: a decoder's starts with its prompt
            self.seen[i] = False
            if not self.seq2seq:
                self.seen[i].index_fill_(0, upload(list(r.ids), self.device), True)
        if shifts(r) or (last is not None and shifts(last)):  # a row holds its own request's shift, else zeros
            self.shift[i] = 0.0  # (OpenAI's bias and penalties: the penalties count generated tokens only)
            self.generated[i] = set()
            if r.logit_bias:
                ids, bias = zip(*r.logit_bias.items(), strict=True)
                self.shift[i].index_copy_(0, upload(ids, self.device), upload(bias, self.device, torch.float32))
        self.constraints.begin(i, r.constraint, r.stop_ids)
        if self.selector is not None:  # a fill on the device, no sync (before its prefill: the engine's order)
            self.adapter_of[i] = r.adapter

    def note(self, i: int, token: int) -> None:
        """Slot i's text now holds ``token`` (for its repetition penalty, and OpenAI's penalties)."""
        r = self.requests[i]
        if r.repetition_penalty != 1.0:
            self.seen[i, token] = True
        if r.presence_penalty or r.frequency_penalty:  # the shift holds the counts: each time -f, the first -p too
            first = token not in self.generated[i]
            self.generated[i].add(token)
            self.shift[i, token] -= r.frequency_penalty + (r.presence_penalty if first else 0.0)
        self.constraints.note(i, token)

    def move(self, src: int, dst: int, columns: int, source: int) -> None:
        """Slot ``src``'s cached keys and values and its state into the free slot ``dst`` (the scheduler's
        compaction): a moved request keeps its bits, a row's result depending on neither index nor neighbours."""
        self.caches.move(src, dst, columns, source if self.seq2seq else 0)
        self.settings[:, dst] = self.settings[:, src]
        self.seen[dst] = self.seen[src]
        self.shift[dst], self.generated[dst] = self.shift[src], self.generated[src]
        self.src_mask[dst] = self.src_mask[src]
        self.generators[dst], self.requests[dst] = self.generators[src], self.requests[src]
        self.constraints.move(src, dst)
        self.adapter_of[dst] = self.adapter_of[src]

    def share(self, src: int, dst: int, columns: int, source: int) -> None:
        """Slot ``src``'s just-prefilled keys and values (``columns`` of them, an encoder-decoder's ``source``
        too) copied into slot ``dst``, whose request has the same prompt: the prefill the copy stands for would
        have written the same bits (a prompt's prefill depends on nothing else)."""
        self.caches.move(src, dst, columns, source if self.seq2seq else 0)
        self.src_mask[dst] = self.src_mask[src]
        self.adapter_of[dst] = self.adapter_of[src]

    def adapters(self, rows: torch.Tensor | slice) -> contextlib.AbstractContextManager:
        """The next model call's rows take the adapters of these slots (an index (R,), or a slice of rows), read
        on the device by the model's adapter layers (generation/adapters.py); nothing for a model without."""
        if self.selector is None:
            return contextlib.nullcontext()
        index = self.adapter_of[rows] if isinstance(rows, slice) else self.adapter_of.index_select(0, rows)
        return self.selector.using(index)

    # -- the calls ------------------------------------------------------------------------------------------------
    def groups(self, arrivals: Arrivals) -> list[tuple[int, Arrivals]]:
        """The arrivals of one step in groups prefilled together, each with its cached prefix length: a decoder's
        prompts with the same cached length and the same width bucket of the rest; an encoder-decoder's one by
        one."""
        if self.seq2seq:
            return [(0, [a]) for a in arrivals]
        groups: dict[tuple[int, int], Arrivals] = {}
        for i, g in arrivals:
            ids = g.request.ids
            start = self.prefix.longest(ids, g.request.adapter) if self.prefix else 0
            groups.setdefault((start, bucket(len(ids) - start, self.prompt_buckets)), []).append((i, g))
        return [(start, group) for (start, _), group in groups.items()]

    def prefill(self, slots: list[int], prompts: list[Sequence[int]], start: int = 0) -> torch.Tensor:
        """Write prompts (a decoder's, of one width bucket) or one source and the start token into their slots; the
        next-token logits (B, V). ``start``: the prompts' first tokens already in the slots (a cached prefix)."""
        if start:
            for i, ids in zip(slots, prompts, strict=True):
                self.prefix.load(i, ids, start, self.requests[i].adapter)
        width = bucket(max(len(ids) - start for ids in prompts), self.prompt_buckets)
        padded = upload([[*ids[start:], *[self.pad_id] * (width - len(ids) + start)] for ids in prompts],
                        self.device)  # (B, P_b) right-padded
        index = upload(slots, self.device)
        layers = self.caches.prefill(index, start)
        if not self.seq2seq:
            last = upload([len(ids) - 1 - start for ids in prompts], self.device)  # (B,)
            with self.adapters(index):
                return self.call_prefill(layers, padded, last)
        (i,), (ids,) = slots, prompts
        self.src_mask[i] = False
        self.src_mask[i, : len(ids)] = True
        first = torch.full((1, 1), self.start_id, dtype=torch.long, device=self.device)
        return self.call_prefill(layers, padded, self.src_mask[i:i + 1, :width], first)

    def call_prefill(self, *args: torch.Tensor | list) -> torch.Tensor:
        """The prefill model call (cpu.py wraps it in its thread policy)."""
        return self.prefill_fn(self.model, *args)

    def stored(self, prefilled: list[tuple[int, Sequence[int], int]]) -> None:
        """Keep the blocks of prompts just prefilled (slot, prompt, cached start) in the prefix cache."""
        if self.prefix is not None:
            for i, ids, start in prefilled:
                self.prefix.store(i, ids, start, self.requests[i].adapter)

    def step(self, tokens: list[int], lengths: list[int], sources: list[int],
             rows: list[int] | None = None) -> torch.Tensor:
        """One token for each of rows [0, R) (``rows``: those slots instead, one by one) at their columns
        ``lengths``: the next-token logits (R, V). A step computes ``bucket(R)`` rows; the padding rows' results
        are dropped."""
        n = len(lengths)
        token_rows, lengths_t, columns = self.step_inputs(tokens, lengths, rows)
        width = len(token_rows)
        memory = bucket(max(sources), self.prompt_buckets) if self.seq2seq else 0
        index = upload(rows, self.device) if rows is not None else None
        layers = self.caches.step(lengths_t, columns, memory, index)
        fn = self.step_fn if index is None else self.plain_step_fn
        if self.seq2seq:
            src_mask = self.src_mask[:width, :memory] if index is None else self.src_mask[index, :memory]
            logits = self.call_step(fn, layers, token_rows, lengths_t, columns, src_mask)
        else:
            with self.adapters(slice(0, width) if index is None else index):
                logits = self.call_step(fn, layers, token_rows, lengths_t, columns)
        return logits[:n]

    def step_inputs(self, tokens: list[int], lengths: list[int],
                    rows: list[int] | None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """A step's tokens and lengths (R_b,), padded to its row bucket (``rows``: exactly those), and the columns
        it reads."""
        pad = (len(lengths) if rows is not None else bucket(len(lengths), self.row_buckets)) - len(lengths)
        token_rows = upload(tokens + [self.pad_id] * pad, self.device)  # (R_b,): tensors of their own (a compiled
        lengths_t = upload(lengths + [0] * pad, self.device)  # (R_b,)     step guards on views' offsets)
        return token_rows, lengths_t, bucket(max(lengths) + 1, self.capacity_buckets)

    def call_step(self, fn, *args: torch.Tensor | list | int) -> torch.Tensor:
        """The step's model call (cpu.py wraps it in its products and thread policy)."""
        return fn(self.model, *args)

    def choose(self, logits: torch.Tensor, slots: list[int]) -> list[int]:
        """The next token of each of these slots from its logits (len(slots), V), by the slot's own settings."""
        logits = self.constraints.apply(logits, slots)  # constrained rows: -inf outside their grammar's tokens
        held = [self.requests[i] for i in slots]
        if all(r.temperature == 0 and r.repetition_penalty == 1.0 and not shifts(r) for r in held):
            return logits.argmax(dim=-1).tolist()  # greedy rows: no setting to look up (draw's greedy, directly)
        index = upload(slots, self.device)
        penalised = any(r.repetition_penalty != 1.0 for r in held)
        if any(shifts(r) for r in held):  # (R, V): each row's own shift (zero for the others)
            logits = logits.float() + self.shift.index_select(0, index)
        return draw(logits, self.settings[:, index], [self.generators[i] for i in slots],
                    [r.temperature > 0 for r in held], self.seen.index_select(0, index) if penalised else None,
                    filtered=any(r.top_k or (r.top_p or 1.0) < 1 for r in held)).tolist()

    def reorder(self, index: torch.Tensor) -> None:
        """Rows [0, len(index)) become rows ``index`` (beam search keeps and repeats hypotheses)."""
        self.caches.reorder(index)
        self.src_mask[: len(index)] = self.src_mask.index_select(0, index)
        self.adapter_of[: len(index)] = self.adapter_of.index_select(0, index)
