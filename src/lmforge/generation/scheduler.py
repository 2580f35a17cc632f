"""The scheduler: which requests hold which slots, and when each ends. Plain data only (no torch): the decisions
of continuous batching, apart from the arithmetic (the runner's, runners/).

    scheduler = Scheduler(slots=4)
    scheduler.submit(generation)                    any thread: it waits in a queue
    ended = scheduler.retire()                      cancelled requests leave their slots
    moves = scheduler.compact()                     [(src, dst), ...]: the runner copies those slots' caches
    arrivals = scheduler.admit()                    [(slot, generation), ...]: the runner prefills them
    scheduler.place(slot, generation, ...)          a prefilled request holds its slot
    scheduler.advance(slot, token)                  its new token; True when that ended it (stop token, length)

A request's life, slot by slot (docs/generation.md draws it):

    submit     it waits (first come, first served)
    admit      between two steps it takes the lowest free slot
    step       every held slot decodes one token; the runner computes rows [0, highest held slot]
    leave      a stop token, its length or a cancel frees the slot at once
    compact    before the next admit the highest held slots move down into the holes, so that the rows a step
               computes are the requests it serves: 16 slots with 8 requests left in slots 0-15 would cost 16 rows
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from lmforge.generation.requests import Generation, end


@dataclass
class Slot:
    """The host's record of one held slot: its request, the columns written, and the next step's input."""

    generation: Generation
    length: int  # columns of the cache written: the prompt (a decoder's) or the start token (an encoder-decoder's)
    source: int  # an encoder-decoder's source length (a decoder's: its prompt length)
    stops: frozenset[int]  # the tokens that end it
    token: int = 0  # the newest token, not yet in the cache: the next step's input

    @property
    def request(self):
        return self.generation.request


class Scheduler:
    """Slots and the queue in front of them (see the module docstring). ``submit`` may be called from any thread;
    the rest from the one thread that steps."""

    def __init__(self, slots: int) -> None:
        self.slots: list[Slot | None] = [None] * slots
        self.waiting: collections.deque[Generation] = collections.deque()
        self.lock = threading.Lock()

    # -- the queue ------------------------------------------------------------------------------------------------
    def submit(self, generation: Generation) -> None:
        with self.lock:
            self.waiting.append(generation)

    @property
    def active(self) -> list[int]:
        """The held slots, lowest first."""
        return [i for i, s in enumerate(self.slots) if s is not None]

    def idle(self) -> bool:
        return not self.waiting and not any(self.slots)

    def load(self) -> tuple[int, int, int]:
        """(waiting, slots held, slots): what /health and the queue limit read."""
        return len(self.waiting), sum(s is not None for s in self.slots), len(self.slots)

    def generations(self) -> list[Generation]:
        """Every request waiting or held (a drain cancels them all)."""
        with self.lock:
            return [*self.waiting, *(s.generation for s in self.slots if s is not None)]

    # -- between two steps --------------------------------------------------------------------------------------
    def retire(self) -> list[Generation]:
        """End the held requests that were cancelled (their slots free at once); the ended ones."""
        ended = []
        for i in self.active:
            if self.slots[i].generation.cancelled:
                ended.append(self.end(i, "cancelled"))
        return ended

    def compact(self) -> list[tuple[int, int]]:
        """Move the highest held slots down into the free slots below them, until the held slots are [0, A); the
        moves (src, dst), in order, for the runner to copy the caches the same way."""
        moves = []
        while (active := self.active) and active[-1] >= len(active):
            src, dst = active[-1], self.slots.index(None)
            self.slots[dst], self.slots[src] = self.slots[src], None
            moves.append((src, dst))
        return moves

    def admit(self) -> tuple[list[tuple[int, Generation]], list[Generation]]:
        """Waiting requests into the free slots, lowest first: (arrivals as (slot, generation), and those that
        ended instead: cancelled while waiting, or asking for no token at all)."""
        arrivals, ended = [], []
        free = [i for i, s in enumerate(self.slots) if s is None]
        while len(arrivals) < len(free):
            with self.lock:
                if not self.waiting:
                    break
                generation = self.waiting.popleft()
            if generation.cancelled or generation.request.max_new_tokens == 0:
                end(generation, "cancelled" if generation.cancelled else "length")
                ended.append(generation)
            else:
                arrivals.append((free[len(arrivals)], generation))
        return arrivals, ended

    # -- a request in its slot ----------------------------------------------------------------------------------
    def place(self, i: int, generation: Generation, length: int, source: int, stops: Iterable[int]) -> None:
        """Slot i holds ``generation``, prefilled: ``length`` columns written (``source``: its source length)."""
        self.slots[i] = Slot(generation, length, source, frozenset(stops))

    def advance(self, i: int, token: int, stepped: bool) -> bool:
        """Slot i's new token (``stepped``: by a step, which wrote one more column; else by its prefill); True when
        the token ended the request (a stop token, or its length), which frees the slot."""
        slot = self.slots[i]
        slot.generation.tokens.append(token)
        slot.token = token
        slot.length += stepped
        if token in slot.stops:
            self.end(i, "stop")
            return True
        if len(slot.generation.tokens) >= slot.request.max_new_tokens:
            self.end(i, "length")
            return True
        return False

    def end(self, i: int, reason: str, error: str | None = None) -> Generation:
        """Slot i's request ends (``reason``: stop, length, cancelled, error); its slot is free at once."""
        generation = self.slots[i].generation
        self.slots[i] = None
        end(generation, reason, error)
        return generation
