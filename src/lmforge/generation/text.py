"""Text in and text out around the token-level decoders: prompts as the model expects them, streamed text.

    prompt_ids(model, tokenizer, "To be")    a decoder's prompt is continued (no template tokens);
                                             an encoder-decoder's source is tokenized as its training pairs
    TextStream(tokenizer).add(id)            print only the new text as tokens arrive (outputs.TextOutput)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

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


def cut_at_stop(text: str, strings: Sequence[str]) -> str:
    """``text`` up to and including the first stop string it holds (the rest of the last token goes)."""
    found = [(i + len(s)) for s in strings if (i := text.find(s)) >= 0]
    return text[: min(found)] if found else text


class TextStream:
    """Print a reply's new text as its tokens arrive (``lmforge generate``, the demo): ``outputs.TextOutput`` with
    the stop string kept, as ``--stop`` promises, and a line break at the end.

    >>> class Chars:  # a toy tokenizer: id i is chr(i)
    ...     def decode(self, ids, skip_special_tokens=True): return "".join(map(chr, ids))
    >>> import io; out = io.StringIO(); s = TextStream(Chars(), out)
    >>> for i in b"hi": s.add(i)
    >>> s.close(); out.getvalue()
    'hi\\n'
    """

    def __init__(self, tokenizer: Any, out: TextIO | None = None, stops: Sequence[str] = ()) -> None:
        from lmforge.generation.outputs import TextOutput

        self.text, self.out = TextOutput(tokenizer, stops, keep_stops=True), out or sys.stdout

    @property
    def ids(self) -> list[int]:
        """The tokens added so far."""
        return self.text.ids

    def add(self, token: int) -> None:
        self.out.write(self.text.add(token))
        self.out.flush()

    def close(self) -> None:
        self.out.write(self.text.finish() + "\n")
        self.out.flush()
