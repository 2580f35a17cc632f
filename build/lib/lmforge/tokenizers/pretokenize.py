"""Pre-tokenization: cut text into the words that a subword model then splits further.

Every tokenizer first cuts its input into words with a regular expression; subword merges never
cross a word boundary. The patterns are compiled once (``regex`` module, for ``\\p{L}`` classes).

    >>> [m.group() for m in GPT2_PATTERN.finditer("Hello world's 42!")]
    ['Hello', ' world', "'s", ' 42', '!']
"""

from __future__ import annotations

import regex

# GPT-2 (Radford et al. 2019): contractions, optional-space letters / numbers / other, then spaces.
# The space-before-word convention makes " world" one token; ``\s+(?!\S)`` leaves the last space
# of a run to the next word.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# GPT-4 (cl100k_base): case-insensitive contractions, numbers in groups of at most three digits,
# newlines kept apart from other spaces.
GPT4_SPLIT = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|"""
    r"""\s*[\r\n]|\s+(?!\S)|\s+"""
)

# Words and runs of punctuation, spaces dropped (Hugging Face's ``Whitespace`` pre-tokenizer).
WHITESPACE_SPLIT = r"\w+|[^\w\s]+"

PATTERNS = {"gpt2": GPT2_SPLIT, "gpt4": GPT4_SPLIT, "whitespace": WHITESPACE_SPLIT}

GPT2_PATTERN = regex.compile(GPT2_SPLIT)


def compile_pattern(name_or_regex: str) -> regex.Pattern:
    """Compile a named pattern (``gpt2``, ``gpt4``, ``whitespace``) or a raw regular expression.

    >>> compile_pattern("whitespace").findall("Hi, you!")
    ['Hi', ',', 'you', '!']
    """
    return regex.compile(PATTERNS.get(name_or_regex, name_or_regex))


def split_with_offsets(pattern: regex.Pattern, text: str) -> list[tuple[str, int, int]]:
    """Words of ``text`` with their character spans.

    >>> split_with_offsets(compile_pattern("whitespace"), "ab, c")
    [('ab', 0, 2), (',', 2, 3), ('c', 4, 5)]
    """
    return [(m.group(), m.start(), m.end()) for m in pattern.finditer(text)]


# Rust's ``char::is_whitespace`` (the Unicode White_Space property), which BERT's pre-tokenizer uses.
WHITESPACE_CHARS = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000" + "".join(map(chr, range(0x2000, 0x200B)))
)

# BERT splits on spaces and isolates every punctuation character: ASCII symbols and Unicode P*.
_WS_CLASS = "".join(f"\\u{ord(c):04x}" for c in sorted(WHITESPACE_CHARS))
_PUNCT_CLASS = r"\p{P}!-/:-@\[-`{-~"
BERT_SPLIT = regex.compile(rf"[^{_WS_CLASS}{_PUNCT_CLASS}]+|[{_PUNCT_CLASS}]")


def bert_split(text: str) -> list[tuple[str, int, int]]:
    """BERT's basic pre-tokenization: split on white space, isolate each punctuation character.

    Run on normalized text (see ``normalize.BertNormalizer``), where CJK characters are already
    surrounded by spaces.

    >>> bert_split("don't stop")
    [('don', 0, 3), ("'", 3, 4), ('t', 4, 5), ('stop', 6, 10)]
    """
    return [(m.group(), m.start(), m.end()) for m in BERT_SPLIT.finditer(text)]
