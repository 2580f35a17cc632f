"""A trained classifier at work: class probabilities, the evaluation report, predictions for raw lines.

    evaluate_model(model, tok, "seq-cls", names, examples, max_len)   accuracy, macro-F1, per class, confusion
    predict_lines(model, tok, info, ["It may be a virus."])            [{"label": ..., "probabilities": {...}}]
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.data import tasks


def encode(task: str, examples, tokenizer, names, max_len: int, label_all: bool = False):
    """Examples -> features: pieces and labels (seq-cls) or first-piece tags (token-cls)."""
    if task == "seq-cls":
        return tasks.encode_classification(examples, tokenizer, names, max_len)
    return tasks.encode_tokens(examples, tokenizer, names, max_len, label_all)


@torch.no_grad()
def probabilities(model: nn.Module, features, pad_id: int, batch_size: int = 64, progress: str | None = None
                  ) -> list[torch.Tensor]:
    """softmax of the logits per feature: (C,) for seq-cls, (T_i, C) for token-cls (padding cut off).

    Rows are batched in order of length (little padding) and returned in their original order. ``progress``:
    a bar with this description on standard error.
    """
    from tqdm import tqdm

    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: len(features[i].input_ids))
    out: list[torch.Tensor | None] = [None] * len(features)
    for start in tqdm(range(0, len(order), batch_size), desc=progress, unit=" batches", disable=progress is None,
                      file=sys.stderr):
        rows = order[start: start + batch_size]
        batch = tasks.collate([features[i] for i in rows], pad_id)
        batch.pop("labels", None)
        probs = torch.softmax(model(**{k: v.to(device) for k, v in batch.items()}).logits.float(), -1).cpu()
        for k, i in enumerate(rows):
            out[i] = probs[k] if probs.dim() == 2 else probs[k, : len(features[i].input_ids)]
    return out  # type: ignore[return-value]


def evaluate_model(model: nn.Module, tokenizer, task: str, names: list[str], examples, max_len: int,
                   batch_size: int = 64, png: Path | None = None) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class report and confusion matrix (+ token accuracy and chunk F1 for tags)."""
    from lmforge.train.scores import chunk_f1, classification_report, is_bio

    tasks.check_labels(examples, names)
    index = {n: i for i, n in enumerate(names)}
    features = encode(task, examples, tokenizer, names, max_len)
    probs = probabilities(model, features, tokenizer.pad_id, batch_size)
    if task == "seq-cls":
        gold = [index[ex.label] for ex in examples]
        pred = [int(p.argmax()) for p in probs]
        report = classification_report(gold, pred, names)
    else:
        words = tasks.word_predictions(features, [p.argmax(-1).tolist() for p in probs], len(examples))
        gold = [index[t] for ex in examples for t in ex.tags]
        pred = [p for sent in words for p in sent]
        report = classification_report(gold, pred, names)
        report["token_accuracy"] = report["accuracy"]
        if is_bio(names):
            report.update(chunk_f1([ex.tags for ex in examples], [[names[p] for p in s] for s in words]))
    if png is not None:
        from lmforge.viz.confusion import plot_confusion

        plot_confusion(report["confusion"], names, png, title=f"{task}: accuracy {report['accuracy']:.3f}")
    return report


def predict_lines(model: nn.Module, tokenizer, info: dict[str, Any], lines: list[str]) -> list[dict[str, Any]]:
    """One result per line. seq-cls: ``text`` or ``text<TAB>pair`` -> label and probabilities;
    token-cls: whitespace-separated words -> one label (and its probability) per word."""
    names, task = info["labels"], info["task"]
    max_len = min(int(info.get("max_len") or 512), model.config.max_positions)
    real = [i for i, line in enumerate(lines) if line.strip()]
    results: list[dict[str, Any]] = [{"label": None, "probabilities": {}} if task == "seq-cls"
                                     else {"words": [], "labels": [], "probabilities": []} for _ in lines]
    if task == "seq-cls":
        examples = [tasks.Example(f"line {i + 1}", *[*lines[i].split("\t", 1), None][:2]) for i in real]
    else:
        examples = [tasks.Example(f"line {i + 1}", words=lines[i].split()) for i in real]
    features = encode(task, examples, tokenizer, names, max_len)
    probs = probabilities(model, features, tokenizer.pad_id)
    if task == "seq-cls":
        for i, p in zip(real, probs, strict=True):
            results[i] = {"label": names[int(p.argmax())],
                          "probabilities": {n: round(float(v), 6) for n, v in zip(names, p, strict=True)}}
        return results
    words = tasks.word_predictions(features, [p.argmax(-1).tolist() for p in probs], len(examples))
    best = tasks.word_predictions(features, [p.max(-1).values.tolist() for p in probs], len(examples))
    for k, i in enumerate(real):
        results[i] = {"words": examples[k].words, "labels": [names[p] for p in words[k]],
                      "probabilities": [round(float(v), 6) for v in best[k]]}
    return results
