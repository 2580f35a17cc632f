"""The decoding engine: requests join and leave between steps; every step decodes all of them at once.

    engine = Engine(model, slots=16, tokenizer=tokenizer)
    a = engine.submit(Request(prompt_ids, max_new_tokens=64))                    # greedy
    b = engine.submit(Request(other_ids, temperature=0.8, top_p=0.95, seed=1))    # sampled, its own settings
    engine.run()                   # or engine.step() in a loop while others submit (continuous batching)
    a.tokens, a.finish_reason      # [...], "stop" | "length"

Three parts, each in its own file (docs/generation.md draws them):

    scheduler.py   which requests hold which slots, admission, compaction, stop and length (plain data, no torch)
    runners/       the model's side: caches, the prefill and step calls, sampling (one runner per device family)
    outputs.py     new tokens -> text, stop strings, callbacks (after the step, on the engine's thread or another)

A step: cancelled requests leave; the held slots move down into the holes (compaction); waiting requests take
free slots and are prefilled, their first tokens chosen from their prompts' logits; every held slot decodes one
token in one batched call; the outputs stage is handed the requests the step touched (``sink``). A row's result
does not depend on its neighbours (greedy: tested equal alone and beside 15 others), so a failure can be
isolated: a prefill that fails in a group, or a step that fails, is retried one request at a time, and only the
request that still fails ends ("error").
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable, Sequence

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation import constraints
from lmforge.generation.outputs import Outputs
from lmforge.generation.requests import Generation, Request, check_room, end
from lmforge.generation.runners import make_runner
from lmforge.generation.sampling import token_logprobs
from lmforge.generation.scheduler import Scheduler
from lmforge.generation.slots import upload
from lmforge.models.interfaces import is_encoder_decoder, special_ids

__all__ = ["Engine", "Generation", "Request"]


def same_prompts(arrivals: list[tuple[int, Generation]]) -> tuple[list[tuple[int, Generation]],
                                                                 dict[int, list[tuple[int, Generation]]]]:
    """The arrivals of a step with a prompt no earlier one has (prefilled), and by the slot of each, the later
    arrivals with its prompt (n choices of one request: prefilled once, ``Engine.admit``)."""
    first: dict[tuple[int, ...], int] = {}
    kept: list[tuple[int, Generation]] = []
    twins: dict[int, list[tuple[int, Generation]]] = {}
    for i, generation in arrivals:
        key = (generation.request.adapter, *generation.request.ids)  # one prompt under one adapter
        if key in first:
            twins.setdefault(first[key], []).append((i, generation))
        else:
            first[key] = i
            kept.append((i, generation))
    return kept, twins


def token_ids(ids, vocab: int) -> bool:
    """Whether every element of ``ids`` is an integer (int, NumPy's, a 0-d integer tensor) in [0, vocab)."""
    try:
        return all(0 <= operator.index(i) < vocab for i in ids)
    except TypeError:
        return False


class Engine:
    """Continuous batching over a fixed number of slots (see the module docstring).

    slots: requests decoded together. capacity: the longest text a slot holds (prompt + new tokens; default the
    model's context, at most 2048). memory: an encoder-decoder's longest source. compile: compile the step before
    serving it (default: on CUDA). prefix_blocks: blocks of prompt beginnings kept for reuse (prefix.py).
    runner: "eager" | "cpu" | "compiled" | "graphs" to choose the runner (default: the device's; runners/__init__.py).
    kv_cache: "fp16" keeps the keys and values as half floats (half the memory and the bytes a step reads; the CPU
    and eager runners; slots.py); default the model's own float type.
    sink: what receives the requests each step touched (default: the outputs stage, on this thread).
    """

    def __init__(self, model: nn.Module, slots: int = 8, capacity: int | None = None, tokenizer=None,
                 compile: bool | None = None, memory: int | None = None, start_id: int | None = None,
                 prefix_blocks: int = 0, runner: str | None = None, kv_cache: str | None = None,
                 log: bool = False) -> None:
        context = model.config.max_positions
        self.tokenizer, self.seq2seq = tokenizer, is_encoder_decoder(model)
        self.capacity = min(capacity or min(context, 2048), context)
        self.vocab = model.config.vocab_size  # a prompt's ids must index its embeddings
        self.ids = special_ids(model, tokenizer, start=start_id)  # an encoder-decoder without a start: one line
        self.runner = make_runner(model, slots, self.capacity, min(memory or context, context),
                                  self.ids.decoder_start, prefix_blocks, self.ids.pad, compile, runner, kv_cache)
        self.scheduler = Scheduler(self.runner.n_slots)
        self.outputs = Outputs(tokenizer)
        self.runner.constraints.use(tokenizer, self.ids.stops)
        self.sink: Callable[[list[Generation]], None] = self.outputs.process
        if log:
            print(f"lmforge: decoding with the {self.runner.describe()}", file=sys.stderr, flush=True)

    @property
    def n_slots(self) -> int:
        return self.runner.n_slots

    def warmup(self) -> int:
        """Compile every graph the runner can need before a request waits for one; the number made (0: eager)."""
        return 0 if not self.idle() else self.runner.warmup()

    # -- the queue ----------------------------------------------------------------------------------------------
    def submit(self, request: Request) -> Generation:
        """Queue a request (any thread); it enters a slot at the next step."""
        self.check(request)
        generation = Generation(request)
        self.scheduler.submit(generation)
        return generation

    def check(self, r: Request) -> None:
        """Settings that cannot be served are one line, before the request waits."""
        encoding = hasattr(r.ids, "ids")
        if encoding or not token_ids(r.ids, self.vocab):
            what = "a tokenizer's Encoding (its .ids are the token ids)" if encoding else \
                f"not all token ids in [0, {self.vocab})"
            raise LmforgeError(f"prompt: Request.ids must be a list of token ids; got {what}")
        n, limit = len(r.ids), self.runner.memory if self.seq2seq else self.capacity
        if n == 0:
            raise LmforgeError("prompt: every prompt needs at least one token")
        if n > limit:
            raise LmforgeError(f"prompt: {n} tokens exceed the engine's {'source' if self.seq2seq else 'context'} "
                               f"of {limit}")
        check_room(1 if self.seq2seq else n, r.max_new_tokens, self.capacity)
        if r.stop_strings and self.tokenizer is None:
            raise LmforgeError("stop_strings: the engine needs the tokenizer to read the text the tokens make")
        if r.constraint is not None:
            constraints.check(r.constraint, self.tokenizer)
        served = self.runner.selector.names if self.runner.selector is not None else []
        if not 0 <= r.adapter <= len(served):
            raise LmforgeError(f"adapter: {r.adapter} is not one of this model's adapters (0: none"
                               + "".join(f", {k}: {name}" for k, name in enumerate(served, start=1)) + ")")

    @property
    def active(self) -> list[int]:
        return self.scheduler.active

    def idle(self) -> bool:
        return self.scheduler.idle()

    def waiting(self) -> bool:
        """Whether a request waits for a slot or its prefill (a server's other model calls let it go first)."""
        return bool(self.scheduler.waiting)

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle():
            self.step()

    # -- one step -----------------------------------------------------------------------------------------------
    def step(self) -> None:
        """Retire what was cancelled, admit what waits into free slots (their first tokens handed to the sink, the
        outputs stage, at once), decode one token for every held slot (handed on after it)."""
        touched: list[Generation] = []
        with torch.inference_mode():
            touched += self.scheduler.retire()
            for src, dst in self.scheduler.compact():
                slot = self.scheduler.slots[dst]
                self.runner.move(src, dst, slot.length, slot.source)
            arrivals, ended = self.scheduler.admit()
            touched += ended
            arrivals, twins = same_prompts(arrivals)
            prefilled = []
            for start, group in self.runner.groups(arrivals):
                prefilled += self.admit(group, start, touched, twins)
            self.runner.stored(prefilled)  # once every group is in: no block a group counted on goes first
            if touched:  # the arrivals' first tokens go out now, not after the step (time to first token)
                self.sink(touched)
            if self.scheduler.active:
                self.sink(self.decode())

    def admit(self, group: list[tuple[int, Generation]], start: int, touched: list[Generation],
              twins: dict[int, list[tuple[int, Generation]]]) -> list[tuple[int, Sequence[int], int]]:
        """Prefill requests into their slots in one call (after the first ``start`` tokens, from the prefix
        cache) and choose their first tokens; (slot, prompt, start) of each prefilled. ``twins``: the other
        arrivals with a prefilled request's prompt (n choices), given a copy of its keys and values and its
        logits instead of a prefill of their own. A failure in a group of several retries them one by one, so
        that it ends only the request that causes it."""
        slots, prompts = [i for i, _ in group], [g.request.ids for _, g in group]
        for i, generation in group:  # each slot's settings (its adapter among them) before its prefill
            self.runner.begin(i, generation.request)
        try:
            logits = self.runner.prefill(slots, prompts, start)  # (B, V)
        except Exception as err:
            if len(group) > 1:
                return [done for one in group for done in self.admit([one], start, touched, twins)]
            for _, generation in [group[0], *twins.get(group[0][0], [])]:
                end(generation, "error", f"{type(err).__name__}: {err}")
                touched.append(generation)
            return []
        for (i, generation), row in zip(group, logits, strict=True):
            self.place(i, generation, row, touched)
            for j, twin in twins.get(i, []):
                n = len(twin.request.ids)
                self.runner.begin(j, twin.request)
                self.runner.share(i, j, 1 if self.seq2seq else n, n)
                self.place(j, twin, row, touched)
        return [(i, ids, start) for i, ids in zip(slots, prompts, strict=True)]

    def place(self, i: int, generation: Generation, row: torch.Tensor, touched: list[Generation]) -> None:
        """A prefilled request (its settings given to the runner: ``admit``) into slot i: its place in the
        scheduler, its first token chosen from its prompt's logits ``row`` (V,)."""
        touched.append(generation)
        r = generation.request
        stops = r.stop_ids if r.stop_ids is not None else self.ids.stops
        self.scheduler.place(i, generation, 1 if self.seq2seq else len(r.ids), len(r.ids), stops)
        try:
            self.emit(i, self.runner.choose(row[None], [i])[0], row, stepped=False)
        except Exception as err:  # this request only
            self.scheduler.end(i, "error", f"{type(err).__name__}: {err}")

    def decode(self) -> list[Generation]:
        """One token for every held slot in one batched step (rows [0, highest held slot]; a hole's row is padding);
        a failing step is retried one request at a time, and a request that fails alone ends with its error."""
        active = self.scheduler.active
        held = self.scheduler.slots[: active[-1] + 1]
        generations = [self.scheduler.slots[i].generation for i in active]
        try:
            logits = self.runner.step([s.token if s else self.ids.pad for s in held],
                                      [s.length if s else 0 for s in held], [s.source if s else 1 for s in held])
            if len(active) < len(held):  # a hole below the highest held slot: keep the held rows
                logits = logits.index_select(0, upload(active, logits.device))  # (A, V)
        except Exception:
            return self.decode_alone(active)
        for i, token, row in zip(active, self.runner.choose(logits, active), logits, strict=True):
            self.emit(i, token, row, stepped=True)
        return generations

    def decode_alone(self, active: list[int]) -> list[Generation]:
        """The step of each held slot by itself (its bits are the batch's): the ones that fail end with "error"."""
        touched = []
        for i in active:
            slot = self.scheduler.slots[i]
            touched.append(slot.generation)
            try:
                logits = self.runner.step([slot.token], [slot.length], [slot.source], rows=[i])  # (1, V)
                self.emit(i, self.runner.choose(logits, [i])[0], logits[0], stepped=True)
            except Exception as err:
                self.scheduler.end(i, "error", f"{type(err).__name__}: {err}")
        return touched

    def emit(self, i: int, token: int, logits: torch.Tensor, stepped: bool) -> None:
        """Slot i's new token: kept (with its logits or log-probabilities when asked), noted for its repetition
        penalty, and the scheduler's stop and length decision."""
        generation = self.scheduler.slots[i].generation
        if generation.request.keep_logits:
            generation.logits.append(logits.clone())
        if generation.request.logprobs is not None:
            generation.logprobs.append(token_logprobs(logits, token, generation.request.logprobs))
        self.runner.note(i, token)
        self.scheduler.advance(i, token, stepped)

    def cancel_all(self) -> None:
        """Cancel every request waiting or held; each ends at the next step."""
        for generation in self.scheduler.generations():
            generation.cancel()
