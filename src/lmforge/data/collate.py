"""The self-supervised objectives as batch sources: causal LM, masked LM (+ next-sentence prediction), seq2seq.

Every source is *deterministic*: ``batch(step, micro, rank, world_size)`` draws its examples from a random
generator seeded by (seed, step, micro, row), so a run's data position is simply its step counter — resuming
needs no loader state — and row j of a global batch is the same however many processes share it (rank r of
W holds rows [r*b, (r+1)*b) of the batch one process would draw with W*b rows).

    >>> source = CausalLMSource(TokenShard.open("data/shakespeare"), batch_size=8, seq_len=64)  # doctest: +SKIP
    >>> source.batch(step=0, micro=0)["input_ids"].shape                                          # doctest: +SKIP
    torch.Size([8, 64])
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from lmforge.data.corpus import TokenShard
from lmforge.errors import LmforgeError
from lmforge.nn.loss import IGNORE_INDEX


def row_rng(seed: int, step: int, micro: int, row: int) -> np.random.Generator:
    """The generator of one example: a pure function of where it sits in the run."""
    return np.random.default_rng([seed, step + 1_000_000 * (step < 0), micro, row])


class _Source:
    """Shared machinery: global row indices for a rank, fixed validation batches from step -1, -2, ..."""

    batch_size: int
    eval_shard: TokenShard | None
    n_eval_batches: int
    eval_batch_size: int

    def rows(self, rank: int, world_size: int) -> range:
        return range(rank * self.batch_size, (rank + 1) * self.batch_size)

    def batch(self, step: int, micro: int = 0, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        return self.collate([self.example(self.shard, row_rng(self.seed, step, micro, j))
                             for j in self.rows(rank, world_size)])

    def eval_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        """A fixed validation set: the same batches whatever the training batch size or process count.

        No batches without a validation shard (or with an empty one): evaluation never falls back to the
        training data, which would report a training loss as ``eval_loss``.
        """
        shard = self.eval_shard
        if shard is None or not shard.n_tokens:
            return
        for i in range(self.n_eval_batches):
            rows = range(self.eval_batch_size)
            yield self.collate([self.example(shard, row_rng(self.seed, -1 - i, 0, j)) for j in rows])


# -- causal LM --------------------------------------------------------------------------------------------
@dataclass
class CausalLMSource(_Source):
    """Windows of ``seq_len`` consecutive tokens from the token stream (documents end with the tokenizer's
    end-of-text token, which ``prepare_corpus`` stores when the tokenizer has one).

    The model shifts internally: it predicts ``labels[t + 1]`` from ``input_ids[: t + 1]``, so labels = input_ids.
    """

    shard: TokenShard
    batch_size: int
    seq_len: int
    seed: int = 0
    eval_shard: TokenShard | None = None
    n_eval_batches: int = 8
    eval_batch_size: int = 16

    def __post_init__(self) -> None:
        if self.shard.n_tokens <= self.seq_len:
            raise LmforgeError(f"corpus has {self.shard.n_tokens} tokens, fewer than one window of {self.seq_len + 1}")

    def example(self, shard: TokenShard, rng: np.random.Generator) -> np.ndarray:
        start = int(rng.integers(0, shard.n_tokens - self.seq_len))
        return np.asarray(shard.tokens[start: start + self.seq_len], dtype=np.int64)

    def collate(self, examples: list[np.ndarray]) -> dict[str, torch.Tensor]:
        ids = torch.from_numpy(np.stack(examples))  # (B, T)
        return {"input_ids": ids, "labels": ids.clone()}


# -- masked LM ---------------------------------------------------------------------------------------------
def mask_tokens(
    ids: np.ndarray,
    maskable: np.ndarray,
    rng: np.random.Generator,
    mask_id: int,
    vocab_size: int,
    probability: float = 0.15,
    word_starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """BERT's corruption: choose 15% of the maskable positions; of those 80% → [MASK], 10% → a random token,
    10% unchanged. Returns (corrupted ids, labels) with labels = the original id where chosen, else -100.

    With ``word_starts`` (True where a token begins a word), whole words are chosen: each word is selected with
    probability p and all its sub-tokens are corrupted together.

    >>> ids = np.array([101, 7, 8, 9, 102]); maskable = np.array([0, 1, 1, 1, 0], dtype=bool)
    >>> corrupted, labels = mask_tokens(ids, maskable, np.random.default_rng(2), mask_id=103, vocab_size=200,
    ...                                 probability=0.5)
    >>> corrupted.tolist(), labels.tolist()
    ([101, 103, 8, 103, 102], [-100, 7, -100, 9, -100])
    """
    if word_starts is None:
        chosen = maskable & (rng.random(ids.shape) < probability)
    else:
        word_index = np.cumsum(word_starts | ~maskable) - 1  # every special token is a word of its own
        chosen_words = rng.random(word_index.max() + 1 if ids.size else 0) < probability
        chosen = maskable & chosen_words[word_index]
    labels = np.where(chosen, ids, IGNORE_INDEX)
    action = rng.random(ids.shape)
    corrupted = ids.copy()
    corrupted[chosen & (action < 0.8)] = mask_id
    randomize = chosen & (action >= 0.8) & (action < 0.9)
    corrupted[randomize] = rng.integers(0, vocab_size, size=int(randomize.sum()))
    return corrupted, labels


@dataclass
class SpecialIds:
    """The ids that batch building needs from a tokenizer."""

    cls: int
    sep: int
    mask: int
    pad: int
    vocab_size: int
    word_start: np.ndarray | None = None  # (vocab_size,) bool: the token begins a word (whole-word masking)

    @classmethod
    def from_tokenizer(cls, tokenizer, whole_word: bool = False) -> SpecialIds:
        missing = [n for n in ("cls_id", "sep_id", "mask_id", "pad_id") if getattr(tokenizer, n, None) is None]
        if missing:
            raise LmforgeError(f"masked LM needs a tokenizer with [CLS], [SEP], [MASK] and [PAD]; missing {missing}")
        starts = word_start_table(tokenizer) if whole_word else None
        t = tokenizer
        return cls(t.cls_id, t.sep_id, t.mask_id, t.pad_id, t.vocab_size, starts)


def word_start_table(tokenizer) -> np.ndarray:
    """For each vocabulary id, whether the token begins a word: WordPiece marks continuations with '##'."""
    tokens = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    return np.array([not token.startswith("##") for token in tokens], dtype=bool)


@dataclass
class MaskedLMSource(_Source):
    """[CLS] A [SEP] (B [SEP]) sequences with BERT masking; with ``nsp``, B is the true next segment half the
    time and a segment from another document otherwise (``next_sentence_label`` 0 = is next, 1 = random).

    Segments are runs of whole lines, filled up to the length budget; the pair is cut longest-first.
    """

    shard: TokenShard
    special: SpecialIds
    batch_size: int
    seq_len: int
    nsp: bool = True
    probability: float = 0.15
    seed: int = 0
    eval_shard: TokenShard | None = None
    n_eval_batches: int = 8
    eval_batch_size: int = 16

    def __post_init__(self) -> None:
        if self.shard.n_docs < (2 if self.nsp else 1):
            raise LmforgeError("next-sentence prediction needs at least two documents in the corpus")

    def segment(self, shard: TokenShard, doc: int, start_line: int, budget: int) -> tuple[np.ndarray, int]:
        """Whole lines from ``start_line`` of ``doc`` until ``budget`` tokens; returns (ids, next line)."""
        _, end = shard.doc_line_range(doc)
        parts, size, line = [], 0, start_line
        while line < end and (size == 0 or size + shard.lines[line + 1] - shard.lines[line] <= budget):
            parts.append(shard.line_tokens(line))
            size += parts[-1].size
            line += 1
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return ids[:budget], line

    def example(self, shard: TokenShard, rng: np.random.Generator) -> dict[str, np.ndarray]:
        budget = self.seq_len - (3 if self.nsp else 2)
        doc = int(rng.integers(shard.n_docs))
        first, end = shard.doc_line_range(doc)
        start = int(rng.integers(first, max(first + 1, end - 1)))  # leave a next line when there is one
        if not self.nsp:
            a, _ = self.segment(shard, doc, start, budget)
            return self.pack(a, None, -1, rng)
        a, after = self.segment(shard, doc, start, max(1, int(rng.integers(1, budget))))
        is_random = after >= end or rng.random() < 0.5
        if is_random:
            # Any document but this one; a split of one document (a small validation set) borrows
            # its negatives from the training documents.
            pool = shard if shard.n_docs >= 2 else self.shard
            other = int(rng.integers(pool.n_docs - (pool is shard)))
            other += pool is shard and other >= doc
            lo, hi = pool.doc_line_range(other)
            b, _ = self.segment(pool, other, int(rng.integers(lo, hi)), budget)
        else:
            b, _ = self.segment(shard, doc, after, budget)
        a, b = truncate_longest_first(a, b, budget)
        return self.pack(a, b, int(is_random), rng)

    def pack(self, a: np.ndarray, b: np.ndarray | None, nsp_label: int, rng: np.random.Generator) -> dict:
        s = self.special
        parts = [[s.cls], a, [s.sep]] + ([b, [s.sep]] if b is not None else [])
        ids = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
        types = np.zeros_like(ids)
        if b is not None:
            types[a.size + 2:] = 1
        maskable = np.ones(ids.size, dtype=bool)
        maskable[[0, a.size + 1, ids.size - 1]] = False  # [CLS] and the [SEP]s are never masked
        starts = s.word_start[ids] if s.word_start is not None else None
        corrupted, labels = mask_tokens(ids, maskable, rng, s.mask, s.vocab_size, self.probability, starts)
        return {"input_ids": corrupted, "token_type_ids": types, "labels": labels, "nsp": nsp_label}

    def collate(self, examples: list[dict]) -> dict[str, torch.Tensor]:
        n, t = len(examples), self.seq_len
        ids = torch.full((n, t), self.special.pad, dtype=torch.long)
        types = torch.zeros(n, t, dtype=torch.long)
        labels = torch.full((n, t), IGNORE_INDEX, dtype=torch.long)
        attention = torch.zeros(n, t, dtype=torch.long)
        for i, ex in enumerate(examples):
            k = ex["input_ids"].size
            ids[i, :k] = torch.from_numpy(ex["input_ids"])
            types[i, :k] = torch.from_numpy(ex["token_type_ids"])
            labels[i, :k] = torch.from_numpy(ex["labels"])
            attention[i, :k] = 1
        batch = {"input_ids": ids, "attention_mask": attention, "token_type_ids": types, "labels": labels}
        if self.nsp:
            batch["next_sentence_label"] = torch.tensor([ex["nsp"] for ex in examples], dtype=torch.long)
        return batch


def truncate_longest_first(a: np.ndarray, b: np.ndarray, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """Drop tokens from the end of the longer segment until both fit in ``budget``.

    >>> [x.tolist() for x in truncate_longest_first(np.arange(5), np.arange(2), 4)]
    [[0, 1], [0, 1]]
    """
    while a.size + b.size > budget:
        if a.size >= b.size:
            a = a[:-1]
        else:
            b = b[:-1]
    return a, b


# -- seq2seq ------------------------------------------------------------------------------------------------
@dataclass
class Seq2SeqSource(_Source):
    """Aligned (source, target) line pairs: line i of ``shard`` translates line i of ``target_shard``.

    Teacher forcing: decoder input [BOS] y_1 … y_{n-1}, labels y_1 … y_n [EOS]; padding is -100 in the labels.
    """

    shard: TokenShard
    target_shard: TokenShard
    batch_size: int
    max_len: int
    bos_id: int
    eos_id: int
    pad_id: int
    seed: int = 0
    eval_shard: TokenShard | None = None
    eval_target_shard: TokenShard | None = None
    n_eval_batches: int = 8
    eval_batch_size: int = 16

    def __post_init__(self) -> None:
        if len(self.shard.lines) != len(self.target_shard.lines):
            raise LmforgeError(f"source has {len(self.shard.lines) - 1} lines but target has "
                               f"{len(self.target_shard.lines) - 1}: pairs must align")

    def example(self, shard: TokenShard, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        target = self.target_shard if shard is self.shard else self.eval_target_shard
        i = int(rng.integers(len(shard.lines) - 1))
        return shard.line_tokens(i)[: self.max_len], target.line_tokens(i)[: self.max_len - 1]

    def collate(self, examples: list[tuple[np.ndarray, np.ndarray]]) -> dict[str, torch.Tensor]:
        n, t = len(examples), self.max_len
        src = torch.full((n, t), self.pad_id, dtype=torch.long)
        tgt = torch.full((n, t), self.pad_id, dtype=torch.long)
        labels = torch.full((n, t), IGNORE_INDEX, dtype=torch.long)
        src_mask = torch.zeros(n, t, dtype=torch.long)
        tgt_mask = torch.zeros(n, t, dtype=torch.long)
        for i, (x, y) in enumerate(examples):
            src[i, : x.size], src_mask[i, : x.size] = torch.from_numpy(x), 1
            dec_in = np.concatenate([[self.bos_id], y])
            dec_out = np.concatenate([y, [self.eos_id]])
            tgt[i, : dec_in.size], tgt_mask[i, : dec_in.size] = torch.from_numpy(dec_in), 1
            labels[i, : dec_out.size] = torch.from_numpy(dec_out)
        return {"src_ids": src, "tgt_ids": tgt, "src_mask": src_mask, "tgt_mask": tgt_mask, "labels": labels}
