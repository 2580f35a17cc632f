"""Self-training (Yarowsky 1995; Scudder 1965): a classifier labels the unlabeled texts it is sure about,
and a new classifier learns from the labeled set plus those pseudo-labels.

    round 0   fine-tune the starting model on the labeled set L
    round r   predict every unlabeled text u with round r-1's model: p(c | u)
              keep u as (u, argmax_c p) when max_c p >= C (the confidence threshold)
              class-balanced and capped (below), then fine-tune the STARTING model again on L + pseudo-labels

Each round relabels the whole unlabeled pool with the latest model, so a pseudo-label that was wrong in
round 1 can be corrected in round 2; training always restarts from the starting model, so errors of a
round's weights are not carried over, only its labels.

The rule for how many pseudo-labels, in one place (``select_pseudo_labels``)::

    cap    = floor(ratio * |L|)                       at most ratio times as many pseudo-labels as labels
    quota_c = ceil(cap * |L_c| / |L|)                 class c gets its share of the labeled set
    per class: the candidates with max p >= C, most confident first, up to quota_c
    if the total exceeds cap (the rounding up), the least confident are dropped

The quota keeps the pseudo-labeled set's class mix that of the labeled set: without it the first
classifier's favourite classes (those it is confidently right, or wrong, about) flood the training set.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from lmforge.data import tasks
from lmforge.errors import LmforgeError

TABLE_SUFFIXES = (".csv", ".tsv", ".tab", ".jsonl", ".json")  # else: one text per line


def read_unlabeled(path: str | Path, names: list[str]) -> list[tasks.Example]:
    """The texts of ``--unlabeled``: one per line, or the CSV / TSV / JSONL layout with labels optional.

    A file may carry true labels, every row of it, all of them training labels: they are never trained
    on, only used to score the pseudo-labels. Anything else is a one-line error naming the file (and line).
    """
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"--unlabeled: {path}: no such file")
    if path.suffix.lower() in TABLE_SUFFIXES:
        try:
            examples = tasks.read_classification(path, need_label=False)
        except LmforgeError as err:
            raise LmforgeError(f"--unlabeled: {err}") from None
    else:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
        examples = [tasks.Example(f"{path}:{n}", text=line.strip()) for n, line in enumerate(lines, 1)
                    if line.strip()]
    if not examples:
        raise LmforgeError(f"--unlabeled: {path}: no texts (the file is empty)")
    labeled = [ex for ex in examples if ex.label]
    if labeled and len(labeled) != len(examples):
        first = next(ex for ex in examples if not ex.label)
        raise LmforgeError(f"--unlabeled: {first.source}: no label, but other rows of the file have one; an "
                           "unlabeled file carries no labels, or true labels on every row (to score pseudo-labels)")
    known = set(names)
    for ex in labeled:
        if ex.label not in known:
            raise LmforgeError(f"--unlabeled: {ex.source}: label {ex.label!r} is not a training label; an "
                               "unlabeled file carries no labels, or only true ones (to score pseudo-labels)")
    return examples


def select_pseudo_labels(probs: torch.Tensor, labeled_counts: list[int], confidence: float,
                         ratio: float) -> list[tuple[int, int]]:
    """(row, class) pairs to add, sorted by row: the rule of the module docstring.

    probs: (N, C) class probabilities of the N unlabeled texts; labeled_counts: |L_c| for each class c.
    Ties in confidence go to the earlier row, so the choice is deterministic.
    """
    n_labeled = sum(labeled_counts)
    cap = math.floor(ratio * n_labeled)
    best, cls = probs.max(dim=-1)  # (N,), (N,)
    chosen: list[tuple[float, int, int]] = []  # (confidence, row, class)
    for c, count in enumerate(labeled_counts):
        quota = math.ceil(cap * count / n_labeled) if n_labeled else 0
        rows = torch.nonzero((cls == c) & (best >= confidence)).flatten().tolist()
        rows.sort(key=lambda i: (-float(best[i]), i))
        chosen += [(float(best[i]), i, c) for i in rows[:quota]]
    if len(chosen) > cap:
        chosen.sort(key=lambda t: (-t[0], t[1]))
        chosen = chosen[:cap]
    return sorted((row, c) for _, row, c in chosen)


def pseudo_examples(unlabeled: list[tasks.Example], chosen: list[tuple[int, int]],
                    names: list[str]) -> list[tasks.Example]:
    """The chosen texts as training examples with their predicted labels (true labels never leak in)."""
    return [tasks.Example(unlabeled[i].source, text=unlabeled[i].text, pair=unlabeled[i].pair, label=names[c])
            for i, c in chosen]


def pseudo_report(unlabeled: list[tasks.Example], chosen: list[tuple[int, int]], names: list[str]) -> dict[str, Any]:
    """How many pseudo-labels each class got, and their accuracy when the file carries true labels."""
    counts = Counter(names[c] for _, c in chosen)
    report: dict[str, Any] = {"pseudo_labels": len(chosen),
                              "pseudo_per_class": {n: counts[n] for n in names if counts[n]},
                              "pseudo_accuracy": None}
    if chosen and unlabeled[0].label:
        right = sum(unlabeled[i].label == names[c] for i, c in chosen)
        report["pseudo_accuracy"] = round(right / len(chosen), 6)
    return report
