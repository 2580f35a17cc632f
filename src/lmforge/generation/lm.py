"""``LM``: a language model ready to generate — the model, its tokenizer and chat format, and the engine that runs
it. Everything that generates goes through one: ``generate`` / ``stream``, ``lmforge chat``, ``evaluate --tasks``,
beam search and ``lmforge serve``.

    lm = LM(model, tokenizer)                                    # an engine sized as the work needs
    lm.generate([[1, 2, 3], [4, 5]], max_new_tokens=20)          # [Generation, Generation]: tokens, finish_reason
    for step in lm.steps(requests): ...                          # the requests after each step (streaming)
    lm.reply(messages)                                           # a chat reply's tokens, one at a time

    served = LM(model, tokenizer, chat, slots=16, capacity=2048)  # a server's: one engine of fixed size, always

An LM without a fixed size keeps one engine and makes it again, larger, when a call needs more slots or columns
than it has (or while it is busy with another caller's requests): nothing is kept anywhere else.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn

from lmforge.generation.engine import Engine
from lmforge.generation.requests import Generation, Request, check_room
from lmforge.generation.slots import MIN_ROWS, bucket, buckets
from lmforge.models.interfaces import is_encoder_decoder, special_ids


class LM:
    """A model and what it needs to answer (see the module docstring). ``slots`` / ``capacity``: a fixed engine
    (a server's); otherwise sized per call. ``compile``, ``runner``, ``prefix_blocks``, ``start_id``,
    ``kv_cache``: the engine's (generation/engine.py)."""

    def __init__(self, model: nn.Module, tokenizer: Any = None, chat_format: Any = None, *, slots: int | None = None,
                 capacity: int | None = None, compile: bool | None = None, runner: str | None = None,
                 prefix_blocks: int = 0, start_id: int | None = None, kv_cache: str | None = None,
                 log: bool = False) -> None:
        self.model, self.tokenizer, self.chat_format = model.eval(), tokenizer, chat_format
        self.options = {"compile": compile, "runner": runner, "prefix_blocks": prefix_blocks, "start_id": start_id,
                        "kv_cache": kv_cache}
        self.fixed = slots is not None
        self.engine: Engine | None = None
        if self.fixed:
            self.engine = Engine(model, slots, capacity, tokenizer, log=log, **self.options)

    @property
    def context(self) -> int:
        return self.model.config.max_positions

    def engine_for(self, rows: int, longest: int, source: int = 0) -> Engine:
        """The engine, made (again) with >= ``rows`` slots and room for ``longest`` tokens (an encoder-decoder's
        ``source`` too) when the one held is smaller or busy; a fixed engine as it is."""
        e = self.engine
        if self.fixed:
            return e
        fits = e is not None and e.idle() and e.n_slots >= rows and e.capacity >= longest and (
            not source or e.runner.memory >= source)
        if not fits:
            sizes = buckets(min(256, self.context), self.context)
            slots = 1 if rows == 1 else bucket(rows, buckets(MIN_ROWS, max(rows, MIN_ROWS)))
            self.engine = e = Engine(self.model, slots, bucket(min(longest, self.context), sizes), self.tokenizer,
                                     memory=bucket(min(source, self.context), sizes) if source else None,
                                     **self.options)
        return e

    def engine_for_requests(self, requests: Sequence[Request]) -> Engine:
        seq2seq = is_encoder_decoder(self.model)
        longest = max((1 if seq2seq else len(r.ids)) + r.max_new_tokens for r in requests)
        return self.engine_for(len(requests), longest, max(len(r.ids) for r in requests) if seq2seq else 0)

    # -- generating ---------------------------------------------------------------------------------------------
    def steps(self, requests: Sequence[Request]) -> Iterator[list[Generation]]:
        """Submit the requests and step until all are done, yielding them after each step; leaving the loop
        early cancels the ones still running."""
        engine = self.engine_for_requests(requests)
        handles = [engine.submit(r) for r in requests]
        try:
            while not all(g.done for g in handles):
                engine.step()
                yield handles
        finally:
            if not all(g.done for g in handles):
                for g in handles:
                    g.cancel()
                engine.step()  # frees the slots of the requests cancelled

    def run(self, requests: Sequence[Request]) -> list[Generation]:
        """The requests' generations, once all are done (``steps`` without looking between steps)."""
        handles = [Generation(r) for r in requests]  # replaced by the engine's at the first step
        for handles in self.steps(requests):  # noqa: B007 (the last is the answer)
            pass
        return handles

    def generate(self, prompts: Sequence[Sequence[int]], **settings: Any) -> list[Generation]:
        """Each prompt's generation (``settings``: the fields of ``Request``: max_new_tokens, temperature, ...)."""
        return self.run([Request(list(p), **settings) for p in prompts])

    def reply(self, messages: Sequence[dict[str, Any]], **settings: Any) -> Iterator[tuple[int, str]]:
        """The assistant's next reply to ``messages`` as it is written: (token, the text it adds) pairs, its
        end-of-turn token included (its text ""), by the chat format; ``settings`` as ``generate``'s
        (max_new_tokens cut to the room the context leaves)."""
        ids = self.chat_format.prompt_ids(messages)
        check_room(len(ids), 1, self.context, "messages")
        settings["max_new_tokens"] = min(settings.get("max_new_tokens", 256), self.context - len(ids))
        settings.setdefault("stop_ids", special_ids(self.model, self.tokenizer).ending(self.chat_format.stop_ids))
        texts: list[str] = []
        sent = 0
        for (g,) in self.steps([Request(ids, on_text=texts.append, **settings)]):
            new = texts[sent:len(g.tokens)]
            if g.done and new and len(texts) > len(g.tokens):  # what the end released joins the last token's
                new[-1] += "".join(texts[len(g.tokens):])
            yield from zip(g.tokens[sent:], new, strict=True)
            sent = len(g.tokens)
