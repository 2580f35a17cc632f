"""Normalization: the text clean-up that runs before pre-tokenization, keeping track of offsets.

A normalizer returns the new text and, for every character of it, the index of the character of
the original text it came from, so that token offsets always point into what the user typed.

    >>> BertNormalizer()("Hello\\tWORLD")
    ('hello world', None)
    >>> BertNormalizer()("Héllo\\x07!")
    ('hello!', [0, 1, 2, 3, 4, 6])

(``None`` stands for the identity map: every character maps to itself.)
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass

import regex

from lmforge.tokenizers.pretokenize import WHITESPACE_CHARS

# The blocks BERT treats as CJK ideographs (each one becomes a word of its own). Hugging Face's
# Rust normalizer starts the sixth block at U+2B920 (Google's BERT code: U+2B820); we follow the
# Rust one, which is what BertTokenizerFast runs.
CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)

# ASCII characters BERT's cleaner drops: control characters except tab, newline and return.
_ASCII_CONTROL = regex.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_ASCII_SPACES = str.maketrans("\t\n\r", "   ")


def is_cjk(ch: str) -> bool:
    """True for a CJK ideograph.

    >>> is_cjk("中"), is_cjk("a")
    (True, False)
    """
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in CJK_RANGES)


def is_control(ch: str) -> bool:
    """True for characters BERT's cleaner removes: categories Cc, Cf, Co, Cs, but not tab/newline/return.

    Unassigned code points (Cn) stay, as in Hugging Face's normalizer.

    >>> is_control("\\x07"), is_control("\\n"), is_control("\\u200b"), is_control("\\u0378")
    (True, False, True, False)
    """
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf", "Co", "Cs")


def strip_accents(text: str) -> str:
    """Decompose (NFD) and drop the non-spacing marks.

    >>> strip_accents("café naïve")
    'cafe naive'
    """
    return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")


@dataclass
class BertNormalizer:
    """BERT's normalizer: clean, pad CJK characters with spaces, strip accents, lowercase.

    ``strip_accents=None`` means "same as ``lowercase``" (the uncased BERT models).

    >>> BertNormalizer()("Ça 中!")
    ('ca  中 !', [0, 1, 2, 3, 3, 3, 4])
    """

    clean_text: bool = True
    handle_chinese_chars: bool = True
    strip_accents: bool | None = None
    lowercase: bool = True

    def __post_init__(self) -> None:
        self._char_cache: dict[str, str] = {}

    def _char(self, ch: str) -> str:
        """What one character becomes (possibly nothing, possibly several characters)."""
        out = self._char_cache.get(ch)
        if out is not None:
            return out
        out = ch
        if self.clean_text:
            if ch in "\x00\ufffd" or is_control(ch):
                out = ""
            elif ch in WHITESPACE_CHARS:
                out = " "
        if self.handle_chinese_chars and out and is_cjk(out):
            out = f" {out} "
        if self.strip_accents if self.strip_accents is not None else self.lowercase:
            out = strip_accents(out)
        if self.lowercase:
            out = out.lower()
        self._char_cache[ch] = out
        return out

    def __call__(self, text: str) -> tuple[str, list[int] | None]:
        """Normalize ``text``; return it with the original index of each character (``None``: identity)."""
        if text.isascii() and not (self.clean_text and _ASCII_CONTROL.search(text)):
            if self.clean_text:
                text = text.translate(_ASCII_SPACES)
            return (text.lower() if self.lowercase else text), None
        pieces: list[str] = []
        index: list[int] = []
        for i, ch in enumerate(text):
            out = self._char(ch)
            if out:
                pieces.append(out)
                index.extend([i] * len(out))
        return "".join(pieces), index

    def to_dict(self) -> dict:
        return {"clean_text": self.clean_text, "handle_chinese_chars": self.handle_chinese_chars,
                "strip_accents": self.strip_accents, "lowercase": self.lowercase}
