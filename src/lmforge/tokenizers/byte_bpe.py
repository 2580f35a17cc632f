"""Byte-level BPE (GPT-2): BPE over the UTF-8 bytes of each word, so nothing is ever unknown.

The 256 byte values are the alphabet. To keep tokens printable, GPT-2 gives each byte a visible
character: printable Latin-1 bytes stand for themselves, the others (control characters, the
space, ...) are moved to U+0100 and up, in order. A space therefore shows as ``Ġ``::

    " world" -> bytes 20 77 6f 72 6c 64 -> "Ġworld"

Words come from the GPT-2 pattern (or GPT-4's, ``pattern="gpt4"``); there is no end-of-word
marker: the leading space of " world" plays that role. Decoding maps the characters back to bytes,
so ``decode(encode(s)) == s`` for every string.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from lmforge.tokenizers.bpe import BPETokenizer, Span, drop_unknown


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's table from byte value to a visible character.

    >>> table = bytes_to_unicode()
    >>> table[ord("a")], table[ord(" ")], table[0], len(set(table.values()))
    ('a', 'Ġ', 'Ā', 256)
    """
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in visible}
    moved = (b for b in range(256) if b not in table)
    for n, b in enumerate(moved):
        table[b] = chr(256 + n)
    return table


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
_LATIN1_TO_VISIBLE = str.maketrans({chr(b): c for b, c in BYTE_TO_CHAR.items()})
# Initial symbols in sorted order of their visible characters (the order of GPT-2's vocabulary).
BYTE_ALPHABET = sorted(BYTE_TO_CHAR.values())


def to_visible(text: str) -> str:
    """UTF-8 bytes of ``text`` as GPT-2's visible characters.

    >>> to_visible(" héllo")
    'ĠhÃ©llo'
    """
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_VISIBLE)


def from_visible(text: str) -> str:
    """Inverse of ``to_visible`` (bytes that are not valid UTF-8 become U+FFFD).

    >>> from_visible("ĠhÃ©llo")
    ' héllo'
    """
    return bytes(CHAR_TO_BYTE[c] for c in text).decode("utf-8", errors="replace")


def byte_spans(word: str) -> list[Span]:
    """For each UTF-8 byte of ``word``, the span of the character it belongs to.

    >>> byte_spans("aé")
    [(0, 1), (1, 2), (1, 2)]
    """
    if word.isascii():
        return [(i, i + 1) for i in range(len(word))]
    return [(i, i + 1) for i, ch in enumerate(word) for _ in range(len(ch.encode("utf-8")))]


class ByteLevelBPETokenizer(BPETokenizer):
    """GPT-2's tokenizer: byte alphabet, GPT-2 (or GPT-4) pre-tokenization, no end-of-word marker."""

    kind = "byte-bpe"
    special_joiner = ""
    default_specials: ClassVar[tuple[str, ...]] = ("<|endoftext|>",)
    default_roles: ClassVar[dict[str, str]] = {"bos": "<|endoftext|>", "eos": "<|endoftext|>", "pad": "<|endoftext|>"}

    def __init__(self, tokens: Sequence[str], merges: Sequence[tuple[str, str]], *,
                 pattern: str = "gpt2", end_of_word: str | None = None, **base: Any) -> None:
        super().__init__(tokens, merges, end_of_word=None, pattern=pattern, **base)
        unk = -1 if self.unk_id is None else self.unk_id
        self._byte_ids = [self.vocab.get(BYTE_TO_CHAR[b], unk) for b in range(256)]

    def _symbols(self, word: str) -> tuple[list[int], list[Span]]:
        byte_ids = self._byte_ids
        return drop_unknown([byte_ids[b] for b in word.encode("utf-8")], byte_spans(word))

    def _decode_plain(self, tokens: list[str]) -> str:
        return from_visible("".join(tokens))

    @classmethod
    def _initial_words(cls, counts: dict[str, int], specials: Sequence[str],
                       end_of_word: str | None) -> tuple[list[str], list[list[int]]]:
        """Alphabet: special tokens, then the 256 byte characters in sorted order."""
        tokens = [*specials, *(c for c in BYTE_ALPHABET if c not in specials)]
        ids = {t: i for i, t in enumerate(tokens)}
        return tokens, [[ids[c] for c in to_visible(w)] for w in counts]

    def _model_dict(self) -> dict[str, Any]:
        return {"merges": [list(m) for m in self.merges], "pattern": self.pattern_name}

    @classmethod
    def _from_model_dict(cls, model: dict[str, Any], **base: Any) -> BPETokenizer:
        return cls(base.pop("tokens"), [tuple(m) for m in model["merges"]], pattern=model["pattern"], **base)

    def readable_vocab(self) -> list[str]:
        """Tokens shown as the text they stand for (invalid partial UTF-8 shown as U+FFFD)."""
        lines = super().readable_vocab()
        special = self.special_ids
        return [line if i in special else f"{line}\t= {from_visible(t)!r}"
                for i, (line, t) in enumerate(zip(lines, self.id_to_token, strict=True))]


def token_bytes(tokenizer: Any, token: int) -> bytes:
    """The bytes ``token`` stands for in a text: a byte-level token's own bytes (part of a character, maybe); any
    other tokenizer's token, or a special token, as the UTF-8 of its decoded text (a special token: its name)."""
    text = tokenizer.id_to_token[token]
    if isinstance(tokenizer, ByteLevelBPETokenizer) and token not in tokenizer.special_ids and \
            all(c in CHAR_TO_BYTE for c in text):
        return bytes(CHAR_TO_BYTE[c] for c in text)
    return tokenizer.decode([token]).encode("utf-8")
