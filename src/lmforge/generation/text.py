"""Text in and text out around the token-level decoders: prompts as the model expects them, streamed text.

    prompt_ids(model, tokenizer, "To be")    a decoder's prompt is continued (no template tokens);
                                             an encoder-decoder's source is tokenized as its training pairs
    TextStream(tokenizer).add(id)            print only the new text as tokens arrive
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import torch

from lmforge.errors import LmforgeError


def source_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one source sentence, as the training pairs were tokenized (no line break, no specials)."""
    from lmforge.data.corpus import encode_lines

    return encode_lines(tokenizer, [text], line_breaks=False)[0].tolist()


def prompt_ids(model: Any, tokenizer: Any, text: str) -> list[int]:
    """The ids ``generate`` starts from: a decoder's prompt without template tokens (an [EOS] at its end
    would end it), an encoder-decoder's source as in training; an empty prompt starts from ``bos_id``."""
    from lmforge.models.interfaces import is_encoder_decoder, special_ids

    if is_encoder_decoder(model):
        ids = source_ids(tokenizer, text)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
    bos = special_ids(model, tokenizer).bos
    if not ids and bos is not None:
        ids = [bos]
    if not ids:
        raise LmforgeError("--prompt: the prompt is empty and the model has no bos_id to start from")
    return ids


def fit_window(ids: list[int], max_new_tokens: int, max_positions: int) -> tuple[list[int], int, str | None]:
    """Make a decoder's prompt + new tokens fit its context: keep the prompt's last tokens (what a sliding
    window would see), and cut the new tokens only when even a one-token prompt leaves too little room.

    Returns (prompt ids, new tokens, a note saying what was cut, or None).

    >>> fit_window([1, 2, 3, 4, 5], 4, 8)
    ([2, 3, 4, 5], 4, 'the prompt has 5 tokens: kept its last 4 so that 4 new tokens fit the 8 positions')
    >>> fit_window([1, 2], 3, 8)
    ([1, 2], 3, None)
    """
    if len(ids) + max_new_tokens <= max_positions:
        return ids, max_new_tokens, None
    new = min(max_new_tokens, max_positions - 1)
    keep = max_positions - new
    note = (f"the prompt has {len(ids)} tokens: kept its last {keep} so that {new} new tokens fit the "
            f"{max_positions} positions")
    if new < max_new_tokens:
        note += f" (asked for {max_new_tokens})"
    return ids[-keep:], new, note


class StopStrings:
    """Ends rows whose text contains a stop string: a string can span tokens and need not be a token.

    ``update(tokens)`` takes each step's tokens (B,) and returns the (B,) rows that have just reached a stop
    string; ``ends[row]`` is then the number of new tokens that row keeps (the last one completes the string).
    Only the text's tail that can hold a new match is decoded each step.

    >>> class Chars:  # a toy tokenizer: id i is chr(i)
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> stops = StopStrings(Chars(), ["!!"], batch=1)
    >>> [bool(stops.update(torch.tensor([ord(c)]))[0]) for c in "ab!!c"]
    [False, False, False, True, False]
    >>> stops.ends, cut_at_stop("ab!!c", ["!!"])
    ([4], 'ab!!')
    """

    def __init__(self, tokenizer: Any, strings: Sequence[str], batch: int) -> None:
        if any(not s for s in strings):
            raise LmforgeError("--stop: a stop string must not be empty")
        self.tokenizer, self.strings = tokenizer, list(strings)
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.ends: list[int | None] = [None] * batch
        self.longest = max(len(s) for s in strings)

    def update(self, tokens: torch.Tensor) -> torch.Tensor:
        hit = torch.zeros(len(self.ids), dtype=torch.bool)
        for row, token in enumerate(tokens.tolist()):
            if self.ends[row] is not None:
                continue
            self.ids[row].append(token)
            # a match ending in this token lies in the last (longest + a few) tokens' text
            tail = self.tokenizer.decode(self.ids[row][-(self.longest + 4):], skip_special_tokens=True)
            last = self.tokenizer.decode(self.ids[row][-1:], skip_special_tokens=True)
            window = tail[-(self.longest + len(last) - 1):] if last else ""
            if any(s in window for s in self.strings):
                self.ends[row] = len(self.ids[row])
                hit[row] = True
        return hit.to(tokens.device)


def cut_at_stop(text: str, strings: Sequence[str]) -> str:
    """``text`` up to and including the first stop string it holds (the rest of the last token goes)."""
    found = [(i + len(s)) for s in strings if (i := text.find(s)) >= 0]
    return text[: min(found)] if found else text


class TextStream:
    """Decode a growing list of ids and print only the new text (held back while a character is split).

    Byte-level BPE can cut a UTF-8 character across two tokens; its first half decodes to U+FFFD,
    so text ending in U+FFFD waits for the next token.

    >>> class Chars:  # a toy tokenizer: id i is chr(i)
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> import io; out = io.StringIO(); s = TextStream(Chars(), out)
    >>> for i in b"hi": s.add(i)
    >>> s.close(); out.getvalue()
    'hi\\n'
    """

    def __init__(self, tokenizer: Any, out: TextIO | None = None, stops: Sequence[str] = ()) -> None:
        self.tokenizer, self.out, self.stops = tokenizer, out or sys.stdout, list(stops)
        self.ids: list[int] = []
        self.printed = ""

    def _text(self) -> tuple[str, bool]:
        """The text so far, cut after a stop string (and whether one was reached)."""
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        cut = cut_at_stop(text, self.stops)
        return cut, len(cut) < len(text) or any(cut.endswith(s) for s in self.stops)

    def add(self, token: int) -> None:
        self.ids.append(token)
        text, stopped = self._text()
        if not stopped:  # hold back a tail that may be the start of a stop string
            held = max((k for s in self.stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
            text = text[: len(text) - held]
        if not text.endswith("\ufffd") and text.startswith(self.printed):
            self.out.write(text[len(self.printed):])
            self.out.flush()
            self.printed = text

    def close(self) -> None:
        text, _ = self._text()
        rest = text[len(self.printed):] if text.startswith(self.printed) else ""
        self.out.write(rest + "\n")
        self.out.flush()


class Detokenizer:
    """Text as tokens arrive, for an API stream: each ``add`` returns only what is safe to send.

    Held back: a UTF-8 character cut between two tokens (U+FFFD at the end), and any tail that could be the start
    of a stop string. A stop string ends the text and is not part of it (OpenAI's ``stop``); ``skip`` ids (an
    end-of-turn token) are left out.

    >>> class Chars:
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> d = Detokenizer(Chars(), stops=["!!"])
    >>> [d.add(ord(c)) for c in "ab!!c"], d.text, d.stopped
    (['a', 'b', '', '', ''], 'ab', True)
    """

    def __init__(self, tokenizer: Any, stops: Sequence[str] = (), skip: Sequence[int] = ()) -> None:
        self.tokenizer, self.stops, self.skip = tokenizer, [s for s in stops if s], frozenset(skip)
        self.ids: list[int] = []
        self.sent = ""
        self.text = ""
        self.stopped = False

    def add(self, token: int) -> str:
        if self.stopped:
            return ""
        if token not in self.skip:
            self.ids.append(token)
        decoded = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        found = [i for s in self.stops if (i := decoded.find(s)) >= 0]
        if found:
            self.stopped, decoded = True, decoded[: min(found)]
            safe = decoded
        else:
            safe = decoded[:-1] if decoded.endswith("\ufffd") else decoded
            hold = max((n for s in self.stops for n in range(1, len(s)) if safe.endswith(s[:n])), default=0)
            safe = safe[: len(safe) - hold]
        self.text = decoded
        new, self.sent = safe[len(self.sent):], safe if len(safe) > len(self.sent) else self.sent
        return new

    def finish(self) -> str:
        """What was held back, once the reply has ended (a stop string is still cut out)."""
        rest = self.text[len(self.sent):]
        self.sent = self.text
        return rest
