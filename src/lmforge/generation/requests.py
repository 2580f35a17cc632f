"""A request to the decoding engine, and what the engine hands back for it.

    g = engine.submit(Request(prompt_ids, max_new_tokens=64, temperature=0.8, seed=1))   # engine.py
    g.tokens, g.finish_reason, g.done      # filled as the engine steps; g.cancel() frees its slot at the next step

Callbacks run in the outputs stage (outputs.py), in order: ``on_token`` with each new token, ``on_text`` once a
token with the text it adds (with the engine's tokenizer; "" while held back, and once more at the end with what
was held), ``on_finish`` once, when the request has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from lmforge.errors import LmforgeError

if TYPE_CHECKING:
    from lmforge.generation.constraints import Constraint


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
    on_token: Callable[[int], None] | None = None  # each new token
    on_text: Callable[[str], None] | None = None  # the text the new tokens make (needs the engine's tokenizer)
    on_finish: Callable[[Generation], None] | None = None  # once it has ended, whatever the reason
    logprobs: int | None = None  # keep each new token's log-probability and this many top alternatives
    presence_penalty: float = 0.0  # OpenAI's: minus this from a token's logit once it was generated
    frequency_penalty: float = 0.0  # OpenAI's: minus this times the times a token was generated
    logit_bias: dict[int, float] | None = None  # OpenAI's: added to these tokens' logits
    constraint: Constraint | None = None  # what the reply must match (constraints.py: JSON schema, regex, ...)
    adapter: int = 0  # the LoRA adapter the request runs under (generation/adapters.py): 0 none, k the k-th served


@dataclass(eq=False)
class Generation:
    """What ``submit`` returns: the request's tokens so far and, once done, why it ended."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[tuple[float, tuple[tuple[int, float], ...]]] = field(default_factory=list)  # Request.logprobs
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" | "error"
    error: str | None = None  # what went wrong, when finish_reason is "error"
    cancelled: bool = False
    keep: int | None = None  # a stop string ended it: its first ``keep`` tokens are the reply
    ended: threading.Event = field(default_factory=threading.Event)  # set once on_finish has run

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def cancel(self) -> None:
        """Free the slot at the next step (any thread may call it)."""
        self.cancelled = True

    def stop_at(self, keep: int) -> None:
        """End at its ``keep``-th token, which completed a stop string (the outputs stage calls it)."""
        self.keep = keep
        self.cancelled = True


def check_room(prompt: int, new: int, context: int, field: str = "prompt") -> None:
    """The one context check: a prompt of ``prompt`` tokens (``field`` names it: prompt, messages) and ``new``
    tokens to add must fit ``context`` positions, with room for at least one new token.

    >>> check_room(10, 60, 64)
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: max_new_tokens: the prompt's 10 tokens + 60 new tokens exceed the context of 64
    """
    if prompt >= context:
        raise LmforgeError(f"{field}: the prompt is {prompt} tokens, the context {context} (prompt and reply "
                           "together): shorten it")
    if prompt + new > context:
        raise LmforgeError(f"max_new_tokens: the prompt's {prompt} tokens + {new} new tokens exceed the context "
                           f"of {context}")


def end(generation: Generation, reason: str, error: str | None = None) -> None:
    """Mark a generation ended: an error stands once given; a stop string's end cuts the tokens after it."""
    if generation.finish_reason == "error":
        return
    if generation.keep is not None and reason != "error":
        reason = "stop"
        del generation.tokens[generation.keep:], generation.logits[generation.keep:]
        del generation.logprobs[generation.keep:]
    generation.finish_reason, generation.error = reason, error
