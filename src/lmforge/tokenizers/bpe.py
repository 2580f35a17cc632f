"""Byte-pair encoding with an end-of-word marker (Sennrich, Haddow and Birch, 2016).

Training starts from characters and repeatedly merges the most frequent adjacent pair. Each word
ends with the symbol ``</w>``, so a subword at the end of a word ("ing</w>") differs from the
same letters inside one ("ing"), and decoding knows where the spaces go. On the toy corpus
``abbc abb abc abb`` (words abbc:1, abb:2, abc:1) the merges are::

    (a, b)=4 -> ab     (ab, b)=3 -> abb     (c, </w>)=2 -> c</w>     (abb, </w>)=2 -> abb</w>

after which every pair occurs once and training stops; ``abbc`` becomes ``abb c</w>``.

Encoding replays the merges on each word, lowest rank (earliest learned) first: ``merge_once`` is the
readable rule (find the earliest-learned pair, merge it everywhere, repeat), quadratic in a word's length;
``merge_word_fast`` gives the same ids in O(n log n) with a heap of candidate pairs over a linked list of
symbols, and encodes every word longer than ``SHORT_WORD`` symbols (a 10^6-letter word: seconds, not hours).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from heapq import heapify, heappop, heappush
from itertools import pairwise
from typing import Any, ClassVar

from lmforge.errors import LmforgeError
from lmforge.tokenizers.base import Tokenizer, WordPieces
from lmforge.tokenizers.pretokenize import compile_pattern
from lmforge.tokenizers.train import count_words, learn_merges, progress_bar

Span = tuple[int, int]
Ranks = dict[tuple[int, int], tuple[int, int]]
SHORT_WORD = 12  # symbols: up to here merge_once is as fast as the heap (merge_word_fast); docs/benchmarks.md


def merge_once(ids: list[int], spans: list[Span], ranks: dict[tuple[int, int], tuple[int, int]]) -> bool:
    """One step of BPE encoding: merge the adjacent pair learned first, everywhere; False if none applies.

    ``ranks`` maps a pair to ``(rank, merged id)``; ``spans`` (character spans) merge alongside.

    >>> ids, spans = [0, 1, 0, 1], [(0, 1), (1, 2), (2, 3), (3, 4)]
    >>> merge_once(ids, spans, {(0, 1): (0, 3), (1, 0): (1, 4)}), ids, spans
    (True, [3, 3], [(0, 2), (2, 4)])
    """
    best = None
    for pair in pairwise(ids):
        found = ranks.get(pair)
        if found is not None and (best is None or found[0] < best[0]):
            best, pair_best = found, pair
    if best is None:
        return False
    a, b = pair_best
    j = 0
    while j < len(ids) - 1:
        if ids[j] == a and ids[j + 1] == b:
            ids[j:j + 2] = [best[1]]
            spans[j:j + 2] = [(spans[j][0], spans[j + 1][1])]
        j += 1
    return True


def apply_merges(ids: list[int], spans: list[Span], ranks: Ranks) -> None:
    """Encode one word in place: ``merge_once`` until no learned pair is left (the reference; O(n^2)).

    >>> ids, spans = [0, 1, 1, 2], [(0, 1), (1, 2), (2, 3), (3, 4)]
    >>> apply_merges(ids, spans, {(0, 1): (0, 3), (3, 1): (1, 4)}); ids, spans
    ([4, 2], [(0, 3), (3, 4)])
    """
    while len(ids) > 1 and merge_once(ids, spans, ranks):
        pass


def merge_word_fast(ids: list[int], spans: list[Span], ranks: Ranks) -> tuple[list[int], list[Span]]:
    """``apply_merges`` in O(n log n): the same ids and spans, returned as new lists.

    Symbol i of the word is a node of a doubly linked list (``after[i]``, ``before[i]``); a merge keeps the
    left node, gives it the merged id and unlinks the right one. A heap holds one key per adjacent pair
    that has a rank, ``rank * n + i`` (i its left node), so it pops the earliest-learned pair, leftmost
    first. ``merge_once`` merges every occurrence of the best pair before looking at the pairs those
    merges create; to keep exactly its order, one round pops every key of the lowest rank, and only then
    are the new pairs pushed. A key is stale (skipped) when its node was unlinked or now starts a
    different pair. Each merge pushes at most two keys: O(n log n) in all.

    >>> merge_word_fast([0, 1, 0, 1, 0], [(i, i + 1) for i in range(5)], {(0, 1): (0, 3), (3, 3): (1, 4)})
    ([4, 0], [(0, 4), (4, 5)])
    """
    n = len(ids)
    ids = list(ids)
    after, before = array("l", range(1, n + 1)), array("l", range(-1, n - 1))  # after[i] == n: i is the last
    heap = [ranks[pair][0] * n + i for i, pair in enumerate(pairwise(ids)) if pair in ranks]
    heapify(heap)
    while heap:
        rank, new = heap[0] // n, []
        while heap and heap[0] // n == rank:
            i = heappop(heap) % n
            j = after[i]
            found = ranks.get((ids[i], ids[j])) if ids[i] >= 0 and j < n else None
            if found is None or found[0] != rank:
                continue  # stale: i was unlinked, or its pair changed
            ids[i], ids[j] = found[1], -1  # i absorbs j
            after[i] = after[j]
            if after[i] < n:
                before[after[i]] = i
            new += [before[i], i]  # the pairs (before i, i) and (i, after i) are new
        for i in new:
            j = after[i] if i >= 0 else n
            found = ranks.get((ids[i], ids[j])) if j < n and ids[i] >= 0 else None
            if found is not None:
                heappush(heap, found[0] * n + i)
    kept = [i for i in range(n) if ids[i] >= 0]  # node i now covers symbols i .. after[i] - 1
    return [ids[i] for i in kept], [(spans[i][0], spans[after[i] - 1][1]) for i in kept]


def drop_unknown(ids: list[int], spans: list[Span]) -> tuple[list[int], list[Span]]:
    """Remove the symbols marked -1 (unknown, no unk token) with their spans.

    >>> drop_unknown([3, -1, 4], [(0, 1), (1, 2), (2, 3)])
    ([3, 4], [(0, 1), (2, 3)])
    """
    if -1 not in ids:
        return ids, spans
    kept = [(i, s) for i, s in zip(ids, spans, strict=True) if i != -1]
    return [i for i, _ in kept], [s for _, s in kept]


class BPETokenizer(Tokenizer):
    """Sennrich BPE: words split on spaces and punctuation, characters plus ``</w>``, learned merges.

    ``glued=True`` is Hugging Face's variant (``end_of_word_suffix``), where a word starts as
    ``l o w</w>`` (marker glued to the last character) rather than ``l o w </w>``.
    """

    kind = "bpe"
    special_joiner = " "
    default_specials: ClassVar[tuple[str, ...]] = ("<pad>", "<unk>", "<s>", "</s>")
    default_roles: ClassVar[dict[str, str]] = {"pad": "<pad>", "unk": "<unk>", "bos": "<s>", "eos": "</s>"}

    def __init__(self, tokens: Sequence[str], merges: Iterable[tuple[str, str]], *,
                 end_of_word: str | None = "</w>", glued: bool = False, pattern: str = "whitespace",
                 **base: Any) -> None:
        super().__init__(tokens, **base)
        self.end_of_word = end_of_word
        self.glued = glued
        self.pattern_name = pattern
        self.pattern = compile_pattern(pattern)
        self.contiguous = pattern in ("gpt2", "gpt4")
        self.merges: list[tuple[str, str]] = [(a, b) for a, b in merges]
        self.ranks: dict[tuple[int, int], tuple[int, int]] = {}
        for rank, (a, b) in enumerate(self.merges):
            ids = (self.vocab.get(a), self.vocab.get(b), self.vocab.get(a + b))
            if None in ids:
                raise LmforgeError(f"merge {rank} ({a!r}, {b!r}): token missing from the vocabulary")
            self.ranks.setdefault((ids[0], ids[1]), (rank, ids[2]))  # type: ignore[arg-type]

    # ---- encoding ----------------------------------------------------------------------------
    def _symbol_id(self, symbol: str) -> int:
        """Id of an initial symbol; the unk id if unknown, or -1 (dropped) when there is no unk token."""
        i = self.vocab.get(symbol)
        if i is None:
            i = self.unk_id
        return -1 if i is None else i

    def _symbols(self, word: str) -> tuple[list[int], list[Span]]:
        """Initial symbols of a word: its characters, then the end-of-word marker.

        Unknown characters become the unk token, or are dropped without one (as Hugging Face does).
        """
        ids = [self._symbol_id(c) for c in word]
        spans = [(i, i + 1) for i in range(len(word))]
        if self.end_of_word is not None and self.glued and word:
            ids[-1] = self._symbol_id(word[-1] + self.end_of_word)
        elif self.end_of_word is not None:
            ids.append(self._symbol_id(self.end_of_word))
            spans.append((len(word), len(word)))
        return drop_unknown(ids, spans)

    def _word_pieces(self, word: str) -> WordPieces:
        ids, spans = self._symbols(word)
        if len(ids) > SHORT_WORD:
            ids, spans = merge_word_fast(ids, spans, self.ranks)
        else:
            apply_merges(ids, spans, self.ranks)
        tokens = self.id_to_token
        return tuple(ids), tuple(tokens[i] for i in ids), tuple(spans)

    def _decode_plain(self, tokens: list[str]) -> str:
        text = "".join(tokens)
        if self.end_of_word:
            text = text.replace(self.end_of_word, " ").rstrip(" ")
        return text

    # ---- training ----------------------------------------------------------------------------
    @classmethod
    def _initial_words(cls, counts: dict[str, int], specials: Sequence[str],
                       end_of_word: str | None) -> tuple[list[str], list[list[int]]]:
        """Alphabet (special tokens, then sorted characters, then ``</w>``) and words as symbol ids."""
        alphabet = sorted({c for w in counts for c in w})
        tokens = [*specials, *(c for c in alphabet if c not in specials)]
        if end_of_word is not None and end_of_word not in tokens:
            tokens.append(end_of_word)
        ids = {t: i for i, t in enumerate(tokens)}
        tail = [ids[end_of_word]] if end_of_word is not None else []
        return tokens, [[ids[c] for c in w] + tail for w in counts]

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2, *,
              special_tokens: Sequence[str] | None = None, roles: dict[str, str] | None = None,
              workers: int = 1, progress: bool = False, **options: Any) -> BPETokenizer:
        """Learn a vocabulary of at most ``vocab_size`` tokens from ``texts``.

        Stops at ``vocab_size`` or when no pair occurs ``min_frequency`` times (2: "more than once").
        """
        specials = list(cls.default_specials if special_tokens is None else special_tokens)
        roles = dict(cls.default_roles if roles is None else roles)
        roles = {r: t for r, t in roles.items() if t in specials}
        probe = cls(specials, [], **options)
        counts = count_words(texts, probe._train_split, workers)
        if not counts:
            raise LmforgeError("empty corpus: no words to learn from")
        tokens, words = cls._initial_words(counts, specials, getattr(probe, "end_of_word", None))
        if vocab_size < len(tokens):
            raise LmforgeError(f"--vocab-size {vocab_size} is smaller than the alphabet "
                               f"({len(tokens)} symbols, special tokens included)")
        with progress_bar(vocab_size - len(tokens), progress) as bar:
            merges = learn_merges(words, list(counts.values()), tokens, vocab_size, min_frequency,
                                  join=probe._join, on_merge=lambda: bar.update())
        pairs = [(tokens[a], tokens[b]) for a, b, _ in merges]
        return cls(tokens, pairs, special_tokens=specials, roles=roles, **options)

    def _train_split(self, text: str) -> list[str]:
        return self.pattern.findall(self._normalize(text)[0])

    @staticmethod
    def _join(a: str, b: str) -> str:
        return a + b

    # ---- saving ------------------------------------------------------------------------------
    def _model_dict(self) -> dict[str, Any]:
        return {"merges": [list(m) for m in self.merges], "end_of_word": self.end_of_word,
                "glued": self.glued, "pattern": self.pattern_name}

    @classmethod
    def _from_model_dict(cls, model: dict[str, Any], **base: Any) -> Tokenizer:
        return cls(base.pop("tokens"), [tuple(m) for m in model["merges"]],
                   end_of_word=model["end_of_word"], glued=model.get("glued", False),
                   pattern=model["pattern"], **base)

    def readable_vocab(self) -> list[str]:
        """Each token, and for merged tokens the two parts it was made from (as minbpe's .vocab)."""
        lines = super().readable_vocab()
        made_of = {a + b: (a, b) for a, b in reversed(self.merges)}
        return [f"{line}\t<- {made_of[t][0]!r} + {made_of[t][1]!r}" if t in made_of else line
                for line, t in zip(lines, self.id_to_token, strict=True)]
