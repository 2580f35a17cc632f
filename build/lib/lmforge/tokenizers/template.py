"""Post-processing: the template that adds special tokens around sequences, and pair truncation.

A template is a list of items: ``$A`` / ``$B`` for the sequences, anything else a special token;
``:1`` sets the type id (default 0). BERT's pair template is::

    ["[CLS]", "$A", "[SEP]", "$B:1", "[SEP]:1"]   ->   [CLS] A [SEP] B [SEP], type ids 0 0 0 1 1

    >>> parse_template(("[CLS]", "$A", "[SEP]:1"))
    (('[CLS]', 0), ('$A', 0), ('[SEP]', 1))
"""

from __future__ import annotations

from functools import lru_cache

from lmforge.tokenizers.encoding import Encoding

NO_TEMPLATE = {"single": ("$A",), "pair": ("$A", "$B:1")}


@lru_cache(maxsize=64)
def parse_template(items: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """Template items as ``(name, type id)`` pairs (see the module docstring)."""
    out = []
    for item in items:
        name, _, type_id = item.rpartition(":")
        out.append((name, int(type_id)) if name and type_id.isdigit() else (item, 0))
    return tuple(out)


def truncate_pair_lengths(n1: int, n2: int, max_length: int) -> tuple[int, int]:
    """Longest-first truncation (as Hugging Face): cut the longer one; if both must go, halve.

    When both are cut they end equal, the second sequence keeping the odd token.

    >>> truncate_pair_lengths(3, 10, 8), truncate_pair_lengths(9, 10, 7)
    ((3, 5), (3, 4))
    """
    if n1 + n2 <= max_length:
        return n1, n2
    swap = n1 > n2
    if swap:
        n1, n2 = n2, n1
    n2 = n1 if n1 > max_length else max(n1, max_length - n1)
    if n1 + n2 > max_length:
        n1 = max_length // 2
        n2 = n1 + max_length % 2
    return (n2, n1) if swap else (n1, n2)


def apply_template(items: tuple[tuple[str, int], ...], first: Encoding, second: Encoding | None,
                   vocab: dict[str, int]) -> Encoding:
    """Assemble the output of a template: sequences with their type ids, special tokens between."""
    if items == (("$A", 0),):
        return first
    enc = Encoding([], [], [], [], [], [], [])
    for name, type_id in items:
        if name[0] == "$":
            part = first if name == "$A" else second
            assert part is not None, "a pair template needs two sequences"
            enc.ids += part.ids
            enc.tokens += part.tokens
            enc.offsets += part.offsets
            enc.word_ids += part.word_ids
            enc.type_ids += [type_id] * len(part.ids) if type_id else part.type_ids
            enc.special_tokens_mask += part.special_tokens_mask
            enc.attention_mask += part.attention_mask
        else:
            enc.ids.append(vocab[name])
            enc.tokens.append(name)
            enc.offsets.append((0, 0))
            enc.word_ids.append(None)
            enc.type_ids.append(type_id)
            enc.special_tokens_mask.append(1)
            enc.attention_mask.append(1)
    return enc
