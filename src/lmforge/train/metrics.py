"""Counting targets (the weights of exact gradient accumulation) and the evaluation metrics.

A model's ``loss`` is a mean over its targets: the label tokens that are not -100. A batch of k·b rows
split into k micro-batches has n_1 + ... + n_k = N targets, and its loss is

    L = (1/N) Σ_tokens ℓ = Σ_i (n_i / N) · L_i          L_i = mean loss of micro-batch i

so weighting each micro-batch's mean by its share n_i / N gives the full batch's loss and gradient
exactly (up to float rounding), however unevenly padding or masking spreads the targets. Batches
without token labels (``next_sentence_label`` only, sequence classification) count rows instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from lmforge.nn.loss import IGNORE_INDEX


def label_shift(model: nn.Module) -> int:
    """How far a model shifts ``labels`` against its logits: 1 for GPT-style next-token loss, else 0.

    A model says so with a ``label_shift`` attribute (lmforge's Decoder and BiLM set 1); without one, 0.
    """
    return int(getattr(model, "label_shift", 0))


def count_targets(batch: dict[str, torch.Tensor], shift: int = 0) -> torch.Tensor:
    """The number of loss targets in a batch, as a 0-dim int64 tensor on the batch's device.

    >>> count_targets({"labels": torch.tensor([[5, 6, -100], [7, -100, -100]])})
    tensor(3)
    >>> count_targets({"labels": torch.tensor([[5, 6, -100], [7, -100, -100]])}, shift=1)   # GPT
    tensor(1)
    """
    labels = batch.get("labels")
    if labels is not None:
        targets = labels[..., shift:] if labels.dim() > 1 else labels
        return (targets != IGNORE_INDEX).sum()
    for key in ("next_sentence_label", "label", "input_ids"):  # one target per row
        if key in batch:
            return torch.tensor(batch[key].shape[0], device=batch[key].device)
    first = next(iter(batch.values()))
    return torch.tensor(first.shape[0], device=first.device)


def count_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the model reads (for tokens/s): input ids; for seq2seq the real source and target tokens.

    >>> count_tokens({"src_ids": torch.zeros(2, 4), "src_mask": torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]),
    ...               "tgt_ids": torch.zeros(2, 3), "tgt_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])})
    9
    """
    total = 0
    for ids, mask in (("input_ids", None), ("decoder_input_ids", None), ("src_ids", "src_mask"),
                      ("tgt_ids", "tgt_mask")):
        if ids in batch:
            total += int(batch[mask].sum()) if mask in batch else int(batch[ids].numel())
    return total


class NonFiniteWatch:
    """The first step whose loss or gradient norm was NaN or infinite, kept on the device until it is read.

    Checking ``math.isfinite(loss)`` after every step makes the host wait for the device every step. Instead
    ``update`` records, on the device, the first bad step of each kind (0 = none yet), and ``first_bad``
    reads them only where the trainer reads numbers anyway (log, eval, save). ``guard`` makes the fused
    AdamW skip its update once anything went bad, the way ``GradScaler`` skips an overflowing fp16 step,
    so the weights in memory stay those of the last good step too.

    >>> watch = NonFiniteWatch(torch.device("cpu"))
    >>> watch.update(1, torch.tensor(2.0), torch.tensor(0.5))
    >>> watch.update(2, torch.tensor(float("nan")), torch.tensor(0.5))
    >>> watch.update(3, torch.tensor(2.0), torch.tensor(float("inf")))
    >>> watch.first_bad()
    ('loss', 2)
    """

    KINDS = ("loss", "gradient norm")

    def __init__(self, device: torch.device) -> None:
        self.first = torch.zeros(len(self.KINDS), dtype=torch.long, device=device)  # (2,) step, 0 = never

    def update(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, check_grad: bool = True) -> None:
        grad_bad = ~torch.isfinite(grad_norm) if check_grad else torch.zeros_like(grad_norm, dtype=torch.bool)
        bad = torch.stack([~torch.isfinite(loss), grad_bad])  # (2,)
        self.first = torch.where((self.first == 0) & bad, step, self.first)

    @contextmanager
    def guard(self, optimizer: torch.optim.Optimizer) -> Iterator[None]:
        """Inside it, ``optimizer.step()`` does nothing (on the device) if a step went bad; fused AdamW only."""
        fused = bool(optimizer.defaults.get("fused"))
        if fused:  # the attribute GradScaler uses to tell a fused optimizer to skip: () float, 1 = skip
            optimizer.found_inf = (self.first > 0).any().float()  # type: ignore[attr-defined]
        try:
            yield
        finally:
            if fused:
                del optimizer.found_inf  # type: ignore[attr-defined]

    def first_bad(self) -> tuple[str, int] | None:
        """(kind, step) of the earliest non-finite value, or None. Reads the device: call it at log steps."""
        found = [(kind, s) for kind, s in zip(self.KINDS, self.first.tolist(), strict=True) if s > 0]
        return min(found, key=lambda item: item[1]) if found else None  # the loss first on a tie


class EvalAccumulator:
    """Sums over validation batches: loss weighted by targets, accuracies, and any ``output.metrics``.

    ``result()`` gives ``{"eval_loss", "eval_ppl", "eval_accuracy", "eval_nsp_accuracy", ...}`` with the
    keys whose inputs were present.
    """

    def __init__(self, shift: int = 0) -> None:
        self.shift = shift
        self.sums: dict[str, float] = {}

    def _add(self, key: str, value: float, weight: float) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value * weight
        self.sums[key + "/w"] = self.sums.get(key + "/w", 0.0) + weight

    @torch.no_grad()
    def update(self, batch: dict[str, torch.Tensor], output: Any) -> None:
        n = float(count_targets(batch, self.shift))
        loss = getattr(output, "loss", None)
        if loss is not None and n > 0:
            self._add("loss", float(loss), n)
        scored = self.predictions(getattr(output, "logits", None), batch.get("labels"))
        if scored is not None and len(scored[1]):
            pred, target = scored
            self._add("accuracy", float((pred == target).float().mean()), float(len(target)))
        nsp_logits, nsp_labels = getattr(output, "next_sentence_logits", None), batch.get("next_sentence_label")
        if nsp_logits is not None and nsp_labels is not None:
            self._add("nsp_accuracy", float((nsp_logits.argmax(-1) == nsp_labels).float().mean()),
                      float(nsp_labels.numel()))
        for key, value in (getattr(output, "metrics", None) or {}).items():  # model-defined, averaged by rows
            rows = next(iter(batch.values())).shape[0]
            self._add(str(key), float(value), float(rows))

    def predictions(self, logits: torch.Tensor | None, labels: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(argmax predictions, labels) over the positions that have a label, or None if the shapes do not pair.

        logits (B, T, V) with labels (B, T) (the model's shift applied), (B, C) with (B,), or (N, V) with (B, T)
        holding N labels: a decoder's ``loss_only`` logits, one row per labelled position in row-major order.
        """
        if logits is None or labels is None:
            return None
        if labels.dim() > 1:  # tokens
            target = labels[:, self.shift:]  # (B, T - s)
            mask = target != IGNORE_INDEX
            if logits.shape[:-1] == labels.shape:  # (B, T, V)
                return logits[:, : logits.shape[1] - self.shift].argmax(-1)[mask], target[mask]
            if logits.dim() == 2 and logits.shape[0] == int(mask.sum()):  # (N, V)
                return logits.argmax(-1), target[mask]
            return None
        if logits.shape[:-1] != labels.shape:
            return None
        mask = labels != IGNORE_INDEX  # one label per row: (B, C) against (B,)
        return logits.argmax(-1)[mask], labels[mask]

    def merge(self, others: Iterable[dict[str, float]]) -> None:
        """Replace the sums by the sum of every process's ``sums`` (gathered across ranks)."""
        total: dict[str, float] = {}
        for sums in others:
            for k, v in sums.items():
                total[k] = total.get(k, 0.0) + v
        self.sums = total

    def result(self) -> dict[str, float]:
        out = {}
        for key in sorted(k for k in self.sums if not k.endswith("/w")):
            weight = self.sums[key + "/w"]
            if weight > 0:
                out[f"eval_{key}"] = self.sums[key] / weight
        if "eval_loss" in out:
            out["eval_ppl"] = math.exp(min(out["eval_loss"], 700.0))  # perplexity = e^loss
        return out
