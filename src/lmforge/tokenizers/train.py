"""Training machinery shared by BPE, byte-level BPE and WordPiece: count words, then learn merges.

All three trainers do the same thing on a table of unique words (each a list of integer symbol
ids, with its frequency in the corpus): repeatedly pick the best adjacent pair of symbols and
merge it everywhere. They differ only in the score of a pair:

* BPE: ``count(a, b)``, the number of times the pair occurs, weighted by word frequency;
* WordPiece: ``count(a, b) / (count(a) * count(b))``, which prefers pairs whose parts rarely
  occur apart.

Speed comes from never recounting: an index from each pair to the words that contain it means a
merge only touches those words, and pair counts change by local deltas (the pair's neighbours).
A max-heap holds the candidates; entries go stale when counts drop and are re-checked lazily
when they reach the top.

**Tie-break** (deterministic): among pairs with the same score, the pair with the smaller
``(id of a, id of b)`` wins. Initial symbols are numbered in sorted order (special tokens first),
merged symbols in the order they were created, so ties go to the older, "more basic" pair. It is
the rule of Hugging Face's ``BpeTrainer``, so byte-level BPE learns exactly its merges.
"""

from __future__ import annotations

import heapq
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import pairwise
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.workers import pool

Split = Callable[[str], list[str]]
_WORKER_SPLIT: Split | None = None


def read_corpus(files: Sequence[str | Path], errors: str = "strict") -> list[str]:
    """Read text files as UTF-8; invalid bytes are an error naming the file and byte offset.

    ``errors="replace"`` substitutes U+FFFD instead.
    """
    from lmforge.files import REPLACE_HINT, read_text_utf8

    texts = [read_text_utf8(name, "text file", errors, REPLACE_HINT) for name in files]
    if files and not any(t.strip() for t in texts):
        raise LmforgeError(f"{', '.join(map(str, files))}: no text to learn from (empty corpus)")
    return texts


def split_points(text: str, size: int = 1 << 20) -> list[str]:
    """Cut ``text`` into chunks of about ``size`` characters at boundaries no word pattern crosses.

    A boundary sits right after a lone newline between two non-space characters ("x\\ny"),
    where every pre-tokenizer in this package ends one word and starts the next.

    >>> split_points("ab\\ncd\\n\\nef\\ngh", size=3)
    ['ab\\n', 'cd\\n\\nef\\n', 'gh']
    """
    chunks, start = [], 0
    while len(text) - start > size:
        i = text.find("\n", start + size - 1)
        while i != -1 and (text[i - 1].isspace() or i + 1 >= len(text) or text[i + 1].isspace()):
            i = text.find("\n", i + 1)
        if i == -1:
            break
        chunks.append(text[start:i + 1])
        start = i + 1
    chunks.append(text[start:])
    return chunks


PIECE_CHARS = 1 << 20  # longest text split or encoded in one piece: memory stays a few times the input


def bounded_pieces(text: str, size: int = PIECE_CHARS) -> Iterator[str]:
    """``text`` in pieces of at most ``size`` characters, cut where no pre-tokenizer joins the two sides.

    A cut goes before a space that follows a non-space ("abc| def"): every pattern here ends a word
    there, so counting or encoding the pieces gives what the whole text gives. A single line of 50 MB
    is then split and counted 1 MB at a time instead of as 10 million words at once. A stretch of
    ``size`` characters without any such space (not text) is cut where it is.

    >>> list(bounded_pieces("ab cd  ef", size=4))
    ['ab', ' cd', '  ef']
    """
    start = 0
    while len(text) - start > size:
        cut = text.rfind(" ", start + 1, start + size + 1)
        while cut > start and text[cut - 1].isspace():
            cut = text.rfind(" ", start + 1, cut)
        if cut <= start:
            cut = start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


def _count_chunk(chunk: str) -> Counter[str]:
    assert _WORKER_SPLIT is not None
    return Counter(_WORKER_SPLIT(chunk))


def count_words(texts: Iterable[str], split: Split, workers: int = 1) -> Counter[str]:
    """Word frequencies of the corpus, the one pass over the raw text.

    >>> count_words(["abbc abb abc abb"], str.split)
    Counter({'abb': 2, 'abbc': 1, 'abc': 1})
    """
    global _WORKER_SPLIT
    counts: Counter[str] = Counter()
    if workers <= 1:
        for text in texts:
            for piece in bounded_pieces(text):
                counts.update(split(piece))
        return counts
    chunks = [p for text in texts for c in split_points(text) for p in bounded_pieces(c)]
    _WORKER_SPLIT = split
    try:
        with pool(workers) as processes:
            for part in processes.imap_unordered(_count_chunk, chunks):
                counts.update(part)
    finally:
        _WORKER_SPLIT = None
    return counts


def pair_counts(words: Sequence[Sequence[int]], freqs: Sequence[int]) -> dict[tuple[int, int], int]:
    """Adjacent-pair counts, each weighted by its word's frequency.

    >>> pair_counts([[1, 2, 3, 1, 2]], [2])
    {(1, 2): 4, (2, 3): 2, (3, 1): 2}
    """
    counts: dict[tuple[int, int], int] = defaultdict(int)
    for word, f in zip(words, freqs, strict=True):
        for pair in pairwise(word):
            counts[pair] += f
    return dict(counts)


def merge_word(word: list[int], a: int, b: int, new: int, f: int, delta: dict[tuple[int, int], int]) -> int:
    """Merge every (a, b) in ``word`` (in place, left to right); record pair-count changes in ``delta``.

    Returns the number of merges. Only the pair and its neighbours change:

    >>> w, d = [1, 2, 3, 1, 2], {}
    >>> merge_word(w, 1, 2, 9, 1, d), w
    (2, [9, 3, 9])
    >>> {p: c for p, c in d.items() if c}
    {(1, 2): -2, (2, 3): -1, (9, 3): 1, (3, 1): -1, (3, 9): 1}
    """
    j, n, k = 0, len(word), 0
    while j < n - 1:
        if word[j] == a and word[j + 1] == b:
            delta[(a, b)] = delta.get((a, b), 0) - f
            if j > 0:
                x = word[j - 1]
                delta[(x, a)] = delta.get((x, a), 0) - f
                delta[(x, new)] = delta.get((x, new), 0) + f
            if j + 2 < n:
                y = word[j + 2]
                delta[(b, y)] = delta.get((b, y), 0) - f
                delta[(new, y)] = delta.get((new, y), 0) + f
            word[j:j + 2] = [new]
            n -= 1
            k += 1
        j += 1
    return k


class PairCounts:
    """The pair statistics of a unique-word table, kept up to date as merges are applied.

    ``counts[(a, b)]``: how often symbol a is followed by b, weighted by word frequency; ``where``: the
    words holding each pair. For WordPiece also ``symbols[s]`` (how often s occurs) and ``with_symbol[s]``
    (the pairs s is part of), since its score count(ab) / (count(a)·count(b)) moves when a or b does.
    """

    def __init__(self, words: list[list[int]], freqs: list[int], wordpiece: bool = False) -> None:
        self.words, self.freqs, self.wordpiece = words, freqs, wordpiece
        self.counts: dict[tuple[int, int], int] = defaultdict(int)
        self.where: dict[tuple[int, int], set[int]] = defaultdict(set)
        self.symbols: dict[int, int] = defaultdict(int)
        self.with_symbol: dict[int, set[tuple[int, int]]] = defaultdict(set)
        for i, (word, f) in enumerate(zip(words, freqs, strict=True)):
            for pair in pairwise(word):
                self.counts[pair] += f
                self.where[pair].add(i)
        if wordpiece:
            for word, f in zip(words, freqs, strict=True):
                for s in word:
                    self.symbols[s] += f
            for pair in self.counts:
                self.with_symbol[pair[0]].add(pair)
                self.with_symbol[pair[1]].add(pair)

    def score(self, pair: tuple[int, int], c: int) -> float:
        """BPE: the count; WordPiece: count(ab) / (count(a)·count(b))."""
        return c / (self.symbols[pair[0]] * self.symbols[pair[1]]) if self.wordpiece else c

    def merge(self, a: int, b: int, new: int) -> set[tuple[int, int]]:
        """Replace every (a, b) by ``new`` in the words; returns the pairs whose score may have changed."""
        delta: dict[tuple[int, int], int] = {}
        for i in self.where.pop((a, b)):
            word, f = self.words[i], self.freqs[i]
            k = merge_word(word, a, b, new, f, delta)
            if not k:
                continue
            for q in pairwise(word):
                if new in q:
                    self.where[q].add(i)
            if self.wordpiece:
                self.symbols[a] -= f * k
                self.symbols[b] -= f * k
                self.symbols[new] += f * k
        for q, d in delta.items():
            if d:
                self.counts[q] += d
        if not self.wordpiece:
            return {q for q, d in delta.items() if d > 0}
        for q in delta:
            if new in q:
                self.with_symbol[q[0]].add(q)
                self.with_symbol[q[1]].add(q)
        return self.with_symbol[a] | self.with_symbol[b] | {q for q in delta if new in q}


def learn_merges(words: list[list[int]], freqs: list[int], tokens: list[str], vocab_size: int,
                 min_frequency: int = 2, join: Callable[[str, str], str] = str.__add__,
                 wordpiece: bool = False, on_merge: Callable[[], None] | None = None) -> list[tuple[int, int, int]]:
    """Learn merges on the unique-word table until ``tokens`` holds ``vocab_size`` symbols.

    Returns the merges as ``(a, b, new_id)`` triples.

    ``words`` (symbol ids) are merged in place and ``tokens`` (symbol strings, by id) grows with the
    new symbols; a merge whose string already exists reuses its id. Stops when no pair occurs at
    least ``min_frequency`` times. ``wordpiece=True`` scores pairs by count(ab) / (count(a)·count(b)).
    The best pair comes from a heap of (-score, a, b) whose stale entries are re-queued when popped.

    >>> words, tokens = [[0, 1, 1, 2], [0, 1, 1], [0, 1, 2]], ["a", "b", "c"]
    >>> learn_merges(words, [1, 2, 1], tokens, 10), tokens[3:]
    ([(0, 1, 3), (3, 1, 4)], ['ab', 'abb'])
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = PairCounts(words, freqs, wordpiece)
    heap = [(-pairs.score(p, c), p[0], p[1]) for p, c in pairs.counts.items() if c >= min_frequency]
    heapq.heapify(heap)
    merges: list[tuple[int, int, int]] = []
    while heap and len(tokens) < vocab_size:
        neg, a, b = heapq.heappop(heap)
        c = pairs.counts.get((a, b), 0)
        if c < min_frequency:
            continue  # counts of existing pairs only fall: this one is finished
        s = pairs.score((a, b), c)
        if s != -neg:
            heapq.heappush(heap, (-s, a, b))  # stale entry: re-queue at its current score
            continue
        text = join(tokens[a], tokens[b])
        new = vocab.get(text)
        if new is None:
            new = vocab[text] = len(tokens)
            tokens.append(text)
        merges.append((a, b, new))
        for q in pairs.merge(a, b, new):
            c = pairs.counts.get(q, 0)
            if c >= min_frequency:
                heapq.heappush(heap, (-pairs.score(q, c), q[0], q[1]))
        if on_merge is not None:
            on_merge()
    return merges


def progress_bar(total: int, show: bool, desc: str = "merges"):
    """A tqdm bar on standard error (a no-op object when ``show`` is false)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="merge", file=sys.stderr, disable=not show, leave=False)
