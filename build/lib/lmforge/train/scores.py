"""Classification metrics: accuracy, macro-F1, a per-class report, the confusion matrix, BIO chunk F1.

Labels are class indices (ints) or names; nothing here needs torch.

    >>> gold, pred = [0, 0, 1, 1, 2], [0, 1, 1, 1, 0]
    >>> accuracy(gold, pred)
    0.6
    >>> confusion_matrix(gold, pred, 3).tolist()               # rows = gold, columns = predicted
    [[1, 1, 0], [0, 2, 0], [1, 0, 0]]
    >>> round(macro_f1(gold, pred, 3), 4)                      # mean of F1 = 0.5, 0.8, 0.0
    0.4333
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np


def accuracy(gold: Sequence[Any], pred: Sequence[Any]) -> float:
    """Share of positions where the prediction equals the gold label (0.0 for no positions)."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold labels but {len(pred)} predictions")
    return sum(g == p for g, p in zip(gold, pred, strict=True)) / len(gold) if gold else 0.0


def confusion_matrix(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> np.ndarray:
    """(C, C) counts: entry [i, j] = how many items of gold class i were predicted as class j."""
    m = np.zeros((num_labels, num_labels), dtype=np.int64)
    np.add.at(m, (np.asarray(gold, dtype=np.int64), np.asarray(pred, dtype=np.int64)), 1)
    return m


def per_class(matrix: np.ndarray, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """{name: {precision, recall, f1, support}} from a confusion matrix (0 where undefined)."""
    tp = np.diag(matrix).astype(np.float64)
    predicted, support = matrix.sum(axis=0), matrix.sum(axis=1)
    report = {}
    for i, name in enumerate(names):
        p = tp[i] / predicted[i] if predicted[i] else 0.0
        r = tp[i] / support[i] if support[i] else 0.0
        f = 2 * p * r / (p + r) if p + r else 0.0
        report[name] = {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(support[i])}
    return report


def macro_f1(gold: Sequence[int], pred: Sequence[int], num_labels: int) -> float:
    """Unweighted mean of the per-class F1 over the classes present in gold or predictions."""
    m = confusion_matrix(gold, pred, num_labels)
    present = [i for i in range(num_labels) if m[i].sum() or m[:, i].sum()]
    report = per_class(m, [str(i) for i in range(num_labels)])
    return float(np.mean([report[str(i)]["f1"] for i in present])) if present else 0.0


def classification_report(gold: Sequence[int], pred: Sequence[int], names: Sequence[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, the per-class table and the confusion matrix, JSON-ready."""
    m = confusion_matrix(gold, pred, len(names))
    return {"accuracy": accuracy(gold, pred), "macro_f1": macro_f1(gold, pred, len(names)),
            "n": len(gold), "per_class": per_class(m, names), "confusion": m.tolist()}


def format_report(report: dict[str, Any]) -> str:
    """The per-class table as text (for standard error and docs)."""
    rows = [f"{'label':<14}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>9}"]
    for name, r in report["per_class"].items():
        if r["support"] or r["precision"]:
            rows.append(f"{name:<14}{r['precision']:>10.3f}{r['recall']:>10.3f}{r['f1']:>10.3f}{r['support']:>9}")
    rows.append(f"accuracy {report['accuracy']:.4f}   macro-F1 {report['macro_f1']:.4f}   n {report['n']}")
    return "\n".join(rows)


# -- BIO chunks (seqeval's default, non-strict mode) ------------------------------------------------------
def bio_chunks(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The (type, start, end) chunks of one BIO / IOB tag sequence, end exclusive.

    A chunk starts at B-X, or at I-X after anything but a B-X / I-X (seqeval's lenient rule), and ends
    before O, B-, or an I- of another type.

    >>> sorted(bio_chunks(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "B-ORG", "I-LOC"]))
    [('LOC', 3, 4), ('LOC', 4, 5), ('LOC', 6, 7), ('ORG', 5, 6), ('PER', 0, 2)]
    """
    chunks: set[tuple[str, int, int]] = set()
    kind, start = None, 0
    for i, tag in enumerate([*tags, "O"]):
        prefix, _, label = tag.partition("-") if "-" in tag else (tag, "", "")
        ends = prefix in ("O", "B") or (prefix == "I" and label != kind) or prefix not in ("B", "I")
        if kind is not None and ends:
            chunks.add((kind, start, i))
            kind = None
        if prefix == "B" or (prefix == "I" and kind is None):
            kind, start = label, i
    return chunks


def chunk_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro precision / recall / F1 over exact-match chunks of many sentences (seqeval-style)."""
    n_gold = n_pred = n_hit = 0
    for g, p in zip(gold, pred, strict=True):
        gc, pc = bio_chunks(g), bio_chunks(p)
        n_gold, n_pred, n_hit = n_gold + len(gc), n_pred + len(pc), n_hit + len(gc & pc)
    precision = n_hit / n_pred if n_pred else 0.0
    recall = n_hit / n_gold if n_gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"chunk_precision": precision, "chunk_recall": recall, "chunk_f1": f1}


def is_bio(names: Sequence[str]) -> bool:
    """Do the label names look like BIO tags (every one O, B-X or I-X, and some B-)?"""
    return any(n.startswith("B-") for n in names) and all(n == "O" or n[:2] in ("B-", "I-") for n in names)
