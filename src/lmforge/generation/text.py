"""Text in and text out around the token-level decoders: prompts as the model expects them, streamed text.

    prompt_ids(model, tokenizer, "To be")    a decoder's prompt is continued (no template tokens);
                                             an encoder-decoder's source is tokenized as its training pairs
    TextStream(tokenizer).add(id)            print only the new text as tokens arrive
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from lmforge.errors import LmforgeError


def source_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of one source sentence, as the training pairs were tokenized (no line break, no specials)."""
    from lmforge.data.corpus import encode_lines

    return encode_lines(tokenizer, [text], line_breaks=False)[0].tolist()


def prompt_ids(model: Any, tokenizer: Any, text: str) -> list[int]:
    """The ids ``generate`` starts from: a decoder's prompt without template tokens (an [EOS] at its end
    would end it), an encoder-decoder's source as in training; an empty prompt starts from ``bos_id``."""
    from lmforge.models.interfaces import is_encoder_decoder

    if is_encoder_decoder(model):
        ids = source_ids(tokenizer, text)
    else:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
    if not ids and model.config.bos_id is not None:
        ids = [model.config.bos_id]
    if not ids:
        raise LmforgeError("--prompt: the prompt is empty and the model has no bos_id to start from")
    return ids


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

    def __init__(self, tokenizer: Any, out: TextIO | None = None) -> None:
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids: list[int] = []
        self.printed = ""

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd") and text.startswith(self.printed):
            self.out.write(text[len(self.printed):])
            self.out.flush()
            self.printed = text

    def close(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        rest = text[len(self.printed):] if text.startswith(self.printed) else ""
        self.out.write(rest + "\n")
        self.out.flush()
