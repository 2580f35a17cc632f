"""A request to the decoding engine, what the engine hands back for it, and the engine's record of a slot.

    g = engine.submit(Request(prompt_ids, max_new_tokens=64, temperature=0.8, seed=1))   # engine.py
    g.tokens, g.finish_reason, g.done      # filled as the engine steps; g.cancel() frees its slot at the next step
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from lmforge.generation.text import StopStrings


@dataclass
class Request:
    """One generation: the prompt (a decoder's) or the source (an encoder-decoder's), and its own settings."""

    ids: Sequence[int]
    max_new_tokens: int = 50
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    seed: int | None = None
    generator: torch.Generator | None = None  # instead of seed: draw from this (shared) stream
    stop_ids: Sequence[int] | None = None  # None: the model's eos_id
    stop_strings: Sequence[str] = ()  # needs the engine's tokenizer
    keep_logits: bool = False  # keep each step's raw logits (V,) in Generation.logits
    on_token: Callable[[int], None] | None = None  # called (from the engine's thread) with each new token
    on_finish: Callable[[Generation], None] | None = None  # called once it ends, whatever the reason


@dataclass(eq=False)
class Generation:
    """What ``submit`` returns: the request's tokens so far and, once done, why it ended."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None  # what went wrong, when finish_reason is "error"
    cancelled: bool = False
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        """Free the slot at the next step (any thread may call it)."""
        self.cancelled = True


class Slot:
    """The host's view of one slot: which generation holds it, how many columns it has written, its settings."""

    def __init__(self, generation: Generation, length: int, source: int, stops: frozenset[int],
                 texts: StopStrings | None, generator: torch.Generator | None) -> None:
        self.generation, self.request = generation, generation.request
        self.length, self.source = length, source  # columns written; an encoder-decoder's source length
        self.stops, self.texts, self.generator = stops, texts, generator
        self.token = 0  # the newest token, not yet in the cache: the next step's input


def end(generation: Generation, reason: str, error: str | None = None) -> None:
    """Mark a generation ended, then tell whoever waits (``on_finish``, ``ended``)."""
    generation.finish_reason, generation.error = reason, error
    generation.ended.set()
    if generation.request.on_finish is not None:
        generation.request.on_finish(generation)
