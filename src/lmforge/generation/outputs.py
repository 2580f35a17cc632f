"""The outputs stage: what happens to a request's new tokens after the step that chose them, off the engine's
thread when the caller wants it there (a server runs it on its event loop; ``generate`` right after each step).

    outputs = Outputs(tokenizer)
    outputs.process(generations)     the generations a step touched: their new tokens and their ends

For each request, in order: its new tokens to ``on_token``; the text they make to ``on_text`` (``TextOutput``:
decoded incrementally, a token at a time, never the whole reply again); a stop string ends it at the token that
completes it (the engine frees its slot at its next step, and the tokens past it are cut); once it has ended,
the rest of its text, ``on_finish``, and ``ended`` set. A callback that raises ends its own request ("error"),
never another's and never the engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from lmforge.generation.requests import Generation, end


class TextOutput:
    """A reply's text as its tokens arrive: each ``add`` returns only what is safe to show.

    Decoding is incremental: each token decodes the few tokens since the last text shown (and those before them
    for context), so a reply of n tokens costs O(n), not O(n²). Held back: a UTF-8 character cut between two
    tokens (U+FFFD at the end) and any tail that could be the start of a stop string. A stop string ends the text
    and is not part of it (OpenAI's ``stop``; ``stopped`` then says so); ``skip`` ids (an end-of-turn token) are
    left out.

    >>> class Chars:
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> text = TextOutput(Chars(), stops=["!!"])
    >>> [text.add(ord(c)) for c in "ab!!c"], text.text, text.stopped
    (['a', 'b', '', '', ''], 'ab', True)
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = (), skip: Iterable[int] = (),
                 keep_stops: bool = False) -> None:
        self.tokenizer, self.stops, self.skip = tokenizer, [s for s in stops if s], frozenset(skip)
        self.keep_stops = keep_stops  # the text ends after the stop string (``lmforge generate --stop``), not before
        self.longest = max((len(s) for s in self.stops), default=0)
        # for each stop, by character c: the lengths n < len(stop) whose prefix stop[:n] ends in c, longest first
        self.prefix_ends: list[dict[str, list[int]]] = []
        for stop in self.stops:
            ends: dict[str, list[int]] = {}
            for n in range(len(stop) - 1, 0, -1):
                ends.setdefault(stop[n - 1], []).append(n)
            self.prefix_ends.append(ends)
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] decoded last time (context); ids[read:] not shown yet
        self.decoded = ""  # all the text decoded so far
        self.sent = 0  # characters of it shown
        self.stopped = False

    @property
    def text(self) -> str:
        """The reply's text: what is shown, and what is held back (until ``finish``), cut at a stop string."""
        return self.decoded

    def add(self, token: int) -> str:
        if self.stopped or token in self.skip:
            return ""
        self.ids.append(token)
        new = self.unread(final=False)
        if new is None:
            return ""  # half a character: wait for the token that completes it
        self.decoded += new
        if self.stops:
            window = self.decoded[max(0, len(self.decoded) - len(new) - self.longest + 1):]
            found = [(i, i + len(s)) for s in self.stops if (i := window.find(s)) >= 0]
            if found:
                self.stopped = True
                cut = min(found)[1] if self.keep_stops else min(found)[0]
                self.decoded = self.decoded[: len(self.decoded) - len(window) + cut]
                return self.show(len(self.decoded))
        return self.show(len(self.decoded) - self.held())

    def held(self) -> int:
        """Characters at the end of the text that could begin a stop string (held back until the next token tells):
        the longest stop[:n] the text ends with, looked for only among the prefixes ending in the text's last
        character (a token's cost does not grow with the square of a stop string's length)."""
        if not self.stops or not self.decoded:
            return 0
        last, hold = self.decoded[-1], 0
        for stop, ends in zip(self.stops, self.prefix_ends, strict=True):
            for n in ends.get(last, ()):
                if n <= hold:
                    break
                if self.decoded.endswith(stop[:n]):
                    hold = n
                    break
        return hold

    def unread(self, final: bool) -> str | None:
        """The text of the tokens not decoded yet (with those before them as context), or None while it ends in
        half a character (unless ``final``)."""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], skip_special_tokens=True)
        after = self.tokenizer.decode(self.ids[self.prefix:], skip_special_tokens=True)
        if not final and (after.endswith("\ufffd") or not after.startswith(before)):
            return None
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before):] if after.startswith(before) else after

    def show(self, upto: int) -> str:
        new = self.decoded[self.sent:upto]
        self.sent = max(self.sent, upto)
        return new

    def finish(self) -> str:
        """What was held back, once the reply has ended (a last character left half, as U+FFFD)."""
        if not self.stopped and self.read < len(self.ids):
            self.decoded += self.unread(final=True)
        return self.show(len(self.decoded))


class RequestOutput:
    """The outputs stage's record of one request: tokens handed on so far, and its text."""

    def __init__(self, text: TextOutput | None) -> None:
        self.seen, self.text = 0, text


class Outputs:
    """The outputs stage of one engine (see the module docstring); ``tokenizer``: for text and stop strings."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        self.records: dict[Generation, RequestOutput] = {}

    def process(self, generations: Iterable[Generation]) -> None:
        for generation in dict.fromkeys(generations):  # each once, in order
            if generation.ended.is_set():  # handed on whole already (a failed callback ended it early)
                continue
            try:
                self.advance(generation)
            except Exception as err:  # a callback of this request failed: it ends, alone
                self.fail(generation, f"{type(err).__name__}: {err}")

    def record(self, g: Generation) -> RequestOutput:
        held = self.records.get(g)
        if held is None:
            r = g.request
            wants_text = self.tokenizer is not None and (r.on_text is not None or r.stop_strings)
            skip = r.stop_ids if r.stop_ids is not None else ()
            held = self.records[g] = RequestOutput(TextOutput(self.tokenizer, r.stop_strings, skip)
                                                   if wants_text else None)
        return held

    def advance(self, g: Generation) -> None:
        """Hand on the generation's new tokens and text; finish it once it has ended."""
        held, r = self.record(g), g.request
        tokens = g.tokens[held.seen:]  # a snapshot: the engine may append while we read
        for token in tokens:
            held.seen += 1
            if r.on_token is not None:
                r.on_token(token)
            if held.text is not None:
                new = held.text.add(token)
                if r.on_text is not None:
                    r.on_text(new)  # once a token, "" while held back
                if held.text.stopped:
                    g.stop_at(held.seen)  # the engine frees the slot at its next step
                    if g.done:
                        end(g, "stop")  # ended already (its length, say): the stop string is why
                    break
        if g.done and held.seen >= len(g.tokens):
            self.finish(g, held)

    def finish(self, g: Generation, held: RequestOutput) -> None:
        del self.records[g]
        try:
            if held.text is not None and g.request.on_text is not None and (rest := held.text.finish()):
                g.request.on_text(rest)
            if g.request.on_finish is not None:
                g.request.on_finish(g)
        finally:
            g.ended.set()

    def fail(self, g: Generation, error: str) -> None:
        """A callback of ``g`` raised: it ends with "error" (its slot freed at the engine's next step)."""
        g.cancel()
        if g.finish_reason != "error":
            end(g, "error", f"a callback failed: {error}")
        held = self.records.pop(g, None)
        if held is not None and not g.ended.is_set():
            try:
                if g.request.on_finish is not None:
                    g.request.on_finish(g)
            except Exception:
                pass
            finally:
                g.ended.set()
