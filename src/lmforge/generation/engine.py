"""The decoding engine: requests join and leave between steps; every step decodes all of them at once.

    engine = Engine(model, slots=16, tokenizer=tokenizer)
    a = engine.submit(Request(prompt_ids, max_new_tokens=64))                    # greedy
    b = engine.submit(Request(other_ids, temperature=0.8, top_p=0.95, seed=1))    # sampled, its own settings
    engine.run()                   # or engine.step() in a loop while others submit (continuous batching)
    a.tokens, a.finish_reason      # [...], "stop" | "length"

How a request travels (docs/generation.md has the picture):

    submit      it waits in a queue (thread-safe: a server submits from its event loop)
    admit       between two steps it takes the lowest free slot; its prompt is *prefilled* (with the step's
                other arrivals of its width), padded on the right to a length bucket, writing its keys and
                values into its slot (a beginning seen before is copied from the prefix cache, prefix.py, and
                only the rest computed); the logits of its last real token give its first new token at once
    step        all active slots decode together: one token each, written at each slot's own column, attending
                over the first C_b columns of the first S_b slots (buckets), a mask hiding what is not theirs
    leave       a stop token, a stop string, max_new_tokens or cancel() frees the slot at once; before the next
                admit the highest active slots move down into the holes (``compact``: a step computes the
                rows up to the highest active slot), and the next request in the queue takes the lowest free one

Each row is chosen by its own settings (temperature, top-k, top-p, repetition penalty) held as per-slot tensors,
and draws its noise from its own generator (``seed``): a request's output does not depend on its neighbours
(greedy: tested equal alone and beside 15 others; ``slots.py`` says what makes a row independent of the batch).

Compile once: with ``compile=True`` (default on CUDA) the prefill and the step are each compiled with
``fullgraph=True`` (a graph break is an error) and ``dynamic=False``: one prefill graph per prompt bucket, one
step graph per (row bucket, capacity bucket). Nothing else varies between calls: positions, lengths and the
sampling settings are tensors, and the caches never move. ``compile="dynamic"`` (float32 decoders on CPU, where
a graph per bucket would take an hour to compile) compiles the step once for every row and column count, with the
eager engine's packed products inside (``calls.one_graph_step``), and prefills eagerly.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Sequence

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.calls import (
    arange,
    compiled,
    cpu_prefill,
    cpu_step,
    decoder_prefill,
    decoder_step,
    fits_one_graph,
    one_graph_step,
    seq2seq_prefill,
    seq2seq_step,
)
from lmforge.generation.prefix import PrefixCache
from lmforge.generation.requests import Generation, Request, Slot, end
from lmforge.generation.sampling import draw
from lmforge.generation.slots import MIN_ROWS, SlotCaches, bucket, buckets, multiples
from lmforge.generation.text import StopStrings
from lmforge.models.interfaces import is_encoder_decoder
from lmforge.nn.linear import packable


class Engine:
    """Continuous batching over a fixed number of slots (see the module docstring).

    slots: requests decoded together. capacity: the longest text a slot holds (prompt + new tokens; default
    the model's context, at most 2048). memory: an encoder-decoder's longest source. compile: None = on CUDA;
    "dynamic": one step graph for all shapes (float32 decoders on CPU; see the module docstring).
    prefix_blocks: blocks of prompt beginnings kept for reuse (prefix.py; eager decoders; 0: none).
    """

    def __init__(self, model: nn.Module, slots: int = 8, capacity: int | None = None, tokenizer=None,
                 compile: bool | str | None = None, memory: int | None = None, start_id: int | None = None,
                 prefix_blocks: int = 0) -> None:
        config = model.config
        self.model, self.tokenizer = model.eval(), tokenizer
        self.seq2seq = is_encoder_decoder(model)
        context = config.max_positions
        self.capacity = min(capacity or min(context, 2048), context)
        self.memory = min(memory or context, context) if self.seq2seq else 0
        self.device = next(model.parameters()).device
        self.dynamic = compile == "dynamic"
        if self.dynamic and not fits_one_graph(model):
            raise LmforgeError("compile='dynamic' is for float32 decoders on CPU (packed products); use compile=True")
        self.compile = self.device.type == "cuda" if compile is None else bool(compile)
        # eager on CPU with float32 weights: products from packed weights (calls.cpu_step), which give a row the
        # same bits beside any number of others, so a step computes exactly its active rows (at least 2 in the
        # dynamic graph). Otherwise one slot is one row (nothing to differ from), more are at least MIN_ROWS, so
        # that a row's bits do not depend on how many others share the step (slots.py): compiled, powers of two
        # (one graph each); eager, multiples of 4
        self.fine = fine = not self.compile or self.dynamic  # fine buckets: shapes that cost no graph each
        self.cpu = fine and self.device.type == "cpu"
        self.packed = self.cpu and packable(model)
        rows = max(slots, MIN_ROWS)
        if slots == 1:
            self.row_buckets = [1]
        elif self.packed:
            self.row_buckets = list(range(2 if self.dynamic else 1, slots + 1))
        elif fine:  # multiples of 4 rows, the slots rounded up (slots.py: other counts change a row's bits)
            self.row_buckets = multiples(MIN_ROWS, -(-rows // MIN_ROWS) * MIN_ROWS)
        else:
            self.row_buckets = buckets(MIN_ROWS, rows)
        self.n_slots = self.row_buckets[-1]
        self.capacity_buckets = multiples(32, self.capacity) if fine else buckets(min(64, self.capacity), self.capacity)
        longest = self.memory if self.seq2seq else self.capacity
        self.prompt_buckets = multiples(8, longest) if fine else buckets(min(16, self.capacity), longest)
        # the dynamic graph holds for keys and values read as a strided view of the buffer; read whole (every
        # column), the view is contiguous and torch.compile would make a second graph: one spare column bucket
        spare = 32 if self.dynamic else 0
        self.caches = SlotCaches(model, self.n_slots, self.capacity + spare, self.memory)
        self.pad_id = config.pad_id if config.pad_id is not None else (config.eos_id or 0)
        self.start_id = start_id if start_id is not None else getattr(config, "bos_id", None)
        if self.seq2seq and self.start_id is None:
            raise LmforgeError("decoder_start_id: the model config has no bos_id; pass start_id")
        vocab = config.vocab_size
        self.seen = torch.zeros(self.n_slots, vocab, dtype=torch.bool, device=self.device)  # (S, V) tokens in text
        self.src_mask = torch.zeros(self.n_slots, max(self.memory, 1), dtype=torch.bool, device=self.device)
        self.settings = torch.zeros(4, self.n_slots, device=self.device)  # rows: temperature, top_k, top_p, penalty
        self.settings[2:] = 1.0
        self.slots: list[Slot | None] = [None] * self.n_slots
        self.waiting: collections.deque[Generation] = collections.deque()
        self.lock = threading.Lock()
        self.busy = False  # generate() / stream() / beam search holding it (generation/decoding.py's pool)
        if not fine:
            graphs = len(self.row_buckets) * len(self.capacity_buckets) + len(self.prompt_buckets)
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs + 2)
            if self.device.type == "cuda":  # CUDA graphs read the caches where they are
                for kv in self.caches.all():
                    torch._dynamo.mark_static_address(kv.k)
                    torch._dynamo.mark_static_address(kv.v)
        if self.dynamic:  # the buffers' sizes are constants of the graph: only rows and columns are symbols (a
            for kv in self.caches.all():  # symbol equal to one of them at the first call would be merged with it)
                torch._dynamo.mark_static(kv.k)
                torch._dynamo.mark_static(kv.v)
        # prompt beginnings seen before, reused (prefix.py): an eager decoder's (a compiled prefill would need a
        # graph per prefix length)
        self.prefix = PrefixCache(self.caches, prefix_blocks) if prefix_blocks and fine and not self.seq2seq \
            else None
        kind = (seq2seq_prefill, seq2seq_step) if self.seq2seq else (decoder_prefill, decoder_step)
        self.prefill_fn, self.step_fn = (compiled(fn, self.device, not fine) for fn in kind)  # eager when fine
        if self.dynamic:
            self.step_fn = one_graph_step(self.step_fn, model)

    def warmup(self) -> int:
        """Compile every graph this engine can need, before any request waits for one: a prefill per prompt
        bucket, a step per (row bucket, capacity bucket) (and per source bucket for an encoder-decoder); with
        ``compile="dynamic"`` the one step graph (called at the fewest and the most rows and columns). Made on
        pad tokens in idle slots, which are zeroed again after. Eager engines have nothing to compile: 0.
        Returns the number of graphs this needs (compiled now, when none existed before): a model call each, and
        the dynamic graph's second call, which compiles nothing, is not counted."""
        if not self.compile or self.active or self.waiting:
            return 0
        calls = 0
        sources = self.prompt_buckets if self.seq2seq else [1]
        shapes = [(rows, columns) for rows in self.row_buckets for columns in self.capacity_buckets]
        with torch.inference_mode():
            if self.dynamic:  # one graph: its first call compiles it, the second checks it serves other shapes
                shapes = [shapes[0], shapes[-1]]
            else:
                for width in self.prompt_buckets:
                    self.prefill([0], [[self.pad_id] * width])
                    calls += 1
            for rows, columns in shapes:
                tokens = torch.full((rows,), self.pad_id, dtype=torch.long, device=self.device)
                for source in sources:
                    self.forward(tokens, [columns - 1] * rows, [source] * rows)
                    calls += 1
            for kv in self.caches.all():  # as new: unwritten columns hold 0
                kv.k.zero_()
                kv.v.zero_()
            self.src_mask.zero_()
        return 1 if self.dynamic else calls

    # -- the queue ----------------------------------------------------------------------------------------------
    def submit(self, request: Request) -> Generation:
        """Queue a request (any thread); it enters a slot at the next step."""
        self.check(request)
        generation = Generation(request)
        with self.lock:
            self.waiting.append(generation)
        return generation

    def check(self, r: Request) -> None:
        """Settings that cannot be served are one line, before the request waits."""
        n, limit = len(r.ids), self.memory if self.seq2seq else self.capacity
        if n == 0:
            raise LmforgeError("prompt: every prompt needs at least one token")
        if n > limit:
            raise LmforgeError(f"prompt: {n} tokens exceed the engine's {'source' if self.seq2seq else 'context'} "
                               f"of {limit}")
        total = (1 if self.seq2seq else n) + r.max_new_tokens
        if total > self.capacity:
            raise LmforgeError(f"max_new_tokens: prompt ({n}) + {r.max_new_tokens} new tokens exceed the context "
                               f"of {self.capacity} tokens")
        if r.stop_strings and self.tokenizer is None:
            raise LmforgeError("stop_strings: the engine needs the tokenizer to read the text the tokens make")

    @property
    def active(self) -> list[int]:
        return [i for i, s in enumerate(self.slots) if s is not None]

    def idle(self) -> bool:
        return not self.waiting and not self.active

    def run(self) -> None:
        """Step until every submitted request is done."""
        while not self.idle():
            self.step()

    # -- one step: retire, admit, decode ------------------------------------------------------------------------
    def step(self) -> None:
        """Retire what was cancelled, admit what waits into free slots, decode one token for every active slot.

        An error inside one request's prefill ends that request ("error"); an error in the batched step ends
        the requests in it: the engine itself keeps serving.
        """
        with torch.inference_mode():
            for i in self.active:
                if self.slots[i].generation.cancelled:
                    self.finish(i, "cancelled")
            self.compact()
            arrivals = []  # (slot, generation): what enters this step
            free = [i for i, slot in enumerate(self.slots) if slot is None]
            while self.waiting and len(arrivals) < len(free):
                with self.lock:
                    generation = self.waiting.popleft()
                if generation.cancelled:
                    end(generation, "cancelled")
                elif generation.request.max_new_tokens == 0:
                    end(generation, "length")
                else:
                    arrivals.append((free[len(arrivals)], generation))
            prefilled = [done for start, group in self.prefill_groups(arrivals) for done in self.admit(group, start)]
            if self.prefix is not None:  # kept once every group is in: no block a group counted on goes first
                for i, ids, start in prefilled:
                    self.prefix.store(i, ids, start)
            if self.active:
                try:
                    self.decode()
                except Exception as err:  # every request of the step
                    for i in self.active:
                        self.finish(i, "error", f"{type(err).__name__}: {err}")

    def compact(self) -> None:
        """Move the highest active slots down into the free slots below them, so that the active slots are
        [0, A): a step computes rows [0, A), not the holes that finished requests leave among them (16 slots
        with 8 requests left in slots 0-15 would cost a 16-row step). A moved request keeps its bits: its keys
        and values are copied, and a row's result does not depend on its index or neighbours (slots.py)."""
        while (active := self.active) and active[-1] >= len(active):
            self.move(active[-1], self.slots.index(None))

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s request, its cached keys and values and its per-slot state into the free slot ``dst``."""
        slot = self.slots[src]
        self.caches.move(src, dst, slot.length, slot.source if self.seq2seq else 0)
        self.settings[:, dst] = self.settings[:, src]
        self.seen[dst] = self.seen[src]
        self.src_mask[dst] = self.src_mask[src]
        self.slots[dst], self.slots[src] = slot, None

    def prefill_groups(self, arrivals: list[tuple[int, Generation]]) -> list[tuple[int, list[tuple[int, Generation]]]]:
        """The arrivals of one step in groups prefilled together, each with its cached prefix length: a decoder's
        prompts with the same cached length and the same width bucket of the rest (each row then has the shapes
        it has alone, so the same bits); one at a time when compiled (one graph per prompt bucket) or for an
        encoder-decoder."""
        if not self.fine or self.seq2seq:
            return [(0, [a]) for a in arrivals]
        groups: dict[tuple[int, int], list[tuple[int, Generation]]] = {}
        for i, g in arrivals:
            ids = g.request.ids
            start = self.prefix.longest(ids) if self.prefix else 0
            groups.setdefault((start, bucket(len(ids) - start, self.prompt_buckets)), []).append((i, g))
        return [(start, group) for (start, _), group in groups.items()]

    def admit(self, group: list[tuple[int, Generation]], start: int = 0) -> list[tuple[int, Sequence[int], int]]:
        """Prefill requests into their slots in one model call (after the first ``start`` tokens, copied from
        the prefix cache) and emit their first tokens; returns (slot, prompt, start) of each prompt prefilled.
        An error in a group of several retries them one by one, so that it ends only the request that causes it."""
        slots, prompts = [i for i, _ in group], [g.request.ids for _, g in group]
        try:
            if start:
                for i, ids in zip(slots, prompts, strict=True):
                    self.prefix.load(i, ids, start)
            logits = self.prefill(slots, prompts, start)  # (B, V)
        except Exception as err:
            if len(group) > 1:
                return [done for one in group for done in self.admit([one], start)]
            end(group[0][1], "error", f"{type(err).__name__}: {err}")
            return []
        for (i, generation), row in zip(group, logits, strict=True):
            try:
                self.start(i, generation, row[None])
            except Exception as err:  # this request only
                self.slots[i] = None
                end(generation, "error", f"{type(err).__name__}: {err}")
        return [(i, ids, start) for i, ids in zip(slots, prompts, strict=True)]

    def start(self, i: int, generation: Generation, logits: torch.Tensor) -> None:
        """Slot i takes a prefilled request: its stops, sampling settings and first token (logits (1, V))."""
        r = generation.request
        n = len(r.ids)
        length = 1 if self.seq2seq else n  # the columns written: the start token, or the prompt
        eos = self.model.config.eos_id
        stops = frozenset(r.stop_ids if r.stop_ids is not None else [eos] if eos is not None else [])
        texts = StopStrings(self.tokenizer, r.stop_strings, 1) if r.stop_strings else None
        generator = r.generator or (torch.Generator(self.device).manual_seed(r.seed) if r.seed is not None else None)
        self.slots[i] = Slot(generation, length, n, stops, texts, generator)
        self.settings[:, i] = torch.tensor([r.temperature, r.top_k or 0, r.top_p or 1.0, r.repetition_penalty])
        if r.repetition_penalty != 1.0:  # the tokens of the text so far: a decoder's starts with its prompt
            self.seen[i] = False
            if not self.seq2seq:
                self.seen[i, torch.as_tensor(list(r.ids), device=self.device)] = True
        token = self.pick(logits, [i])[0]
        self.emit(i, token, logits[0])

    def decode(self) -> None:
        """One token for every active slot, all in one batched model step."""
        active = self.active
        held = [s for s in self.slots[: active[-1] + 1]]
        tokens = torch.tensor([s.token if s else self.pad_id for s in held], device=self.device)
        logits = self.forward(tokens, [s.length if s else 0 for s in held], [s.source if s else 1 for s in held])
        if len(active) < len(held):  # a free slot below the highest active one: keep the active rows only
            logits = logits.index_select(0, torch.tensor(active, device=self.device))  # (A, V)
        for i, token, row in zip(active, self.pick(logits, active), logits, strict=True):
            self.slots[i].length += 1
            self.emit(i, token, row)

    # -- the two model calls ----------------------------------------------------------------------------------
    def prefill(self, slots: list[int], prompts: list[Sequence[int]], start: int = 0) -> torch.Tensor:
        """Write prompts (a decoder's, of one width bucket) or one source and the start token into their slots;
        the next-token logits (B, V). ``start``: the prompts' first tokens already in the slots (a cached prefix),
        so only the rest is computed."""
        width = bucket(max(len(ids) - start for ids in prompts), self.prompt_buckets)
        padded = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)  # (B, P_b) right-padded
        for row, ids in enumerate(prompts):
            padded[row, : len(ids) - start] = torch.as_tensor(list(ids[start:]), dtype=torch.long)
        padded = padded.to(self.device)
        layers = self.caches.prefill(torch.tensor(slots, device=self.device), start)
        if not self.seq2seq:
            last = torch.tensor([len(ids) - 1 - start for ids in prompts], device=self.device)  # (B,)
            with cpu_prefill() if self.cpu else contextlib.nullcontext():
                return self.prefill_fn(self.model, layers, padded, last)
        (i,), (ids,) = slots, prompts
        n = len(ids)
        self.src_mask[i] = False
        self.src_mask[i, :n] = True
        start = torch.full((1, 1), self.start_id, dtype=torch.long, device=self.device)
        return self.prefill_fn(self.model, layers, padded, self.src_mask[i:i + 1, :width], start)

    def forward(self, tokens: torch.Tensor, lengths: list[int], sources: list[int]) -> torch.Tensor:
        """tokens (R,) of slots [0, R) at their columns ``lengths`` -> next-token logits (R, V), one batched step
        over the buckets (S_b >= R rows, C_b > every length columns; an encoder-decoder's M_b source columns)."""
        n = len(lengths)
        rows = bucket(n, self.row_buckets)
        columns = bucket(max(lengths) + 1, self.capacity_buckets)
        padding = [0] * (rows - n)
        token_rows = torch.cat([tokens, tokens.new_full((rows - n,), self.pad_id)]) if rows > n else tokens
        lengths_t = torch.tensor(lengths + padding, device=self.device)  # (S_b,)
        memory = bucket(max(sources), self.prompt_buckets) if self.seq2seq else 0
        layers = self.caches.step(arange(rows, self.device), lengths_t, columns, memory)
        with cpu_step(self.packed) if self.cpu else contextlib.nullcontext():
            if self.seq2seq:
                logits = self.step_fn(self.model, layers, token_rows, lengths_t, columns,
                                      self.src_mask[:rows, :memory])
            else:
                logits = self.step_fn(self.model, layers, token_rows, lengths_t, columns)  # (S_b, V)
        return logits[:n]

    def pick(self, logits: torch.Tensor, slots: list[int]) -> list[int]:
        """The next token of each of these slots from its logits (len(slots), V), by the slot's own settings."""
        index = torch.tensor(slots, device=self.device)
        held = [self.slots[i] for i in slots]
        penalised = any(s.request.repetition_penalty != 1.0 for s in held)
        return draw(logits, self.settings[:, index], [s.generator for s in held],
                    [s.request.temperature > 0 for s in held], self.seen.index_select(0, index) if penalised else None,
                    filtered=any(s.request.top_k or (s.request.top_p or 1.0) < 1 for s in held)).tolist()

    def emit(self, i: int, token: int, logits: torch.Tensor) -> None:
        """Hand a token to its generation; end it at a stop token, a stop string or its length."""
        slot = self.slots[i]
        g, r = slot.generation, slot.request
        g.tokens.append(token)
        slot.token = token
        if r.repetition_penalty != 1.0:
            self.seen[i, token] = True
        if r.keep_logits:
            g.logits.append(logits.clone())
        if r.on_token is not None:
            r.on_token(token)
        if token in slot.stops or (slot.texts is not None and bool(slot.texts.update(torch.tensor([token]))[0])):
            self.finish(i, "stop")
        elif len(g.tokens) >= r.max_new_tokens:
            self.finish(i, "length")

    def finish(self, i: int, reason: str, error: str | None = None) -> None:
        generation = self.slots[i].generation
        self.slots[i] = None
        end(generation, reason, error)
