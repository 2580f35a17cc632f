"""Evaluation during fine-tuning, the best checkpoint and early stopping, as Trainer users expect them.

Every ``eval_every`` steps the model is scored on the evaluation file (``classify.evaluate_model``, or the eval
loss for instruction tuning). The weights that scored best on ``best_metric`` (accuracy, macro_f1 or, for tagging
with BIO labels, chunk_f1; the lowest eval_loss) are kept and put back at the end, so the saved model is the best
one seen, not the last; with ``early_stopping`` = P, training ends after P evaluations in a row without
improvement. The report names the step that was kept:
``{"best": {"step": 120, "metric": "macro_f1", "value": 0.87}, "evals": [...]}``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.train.trainer import Callback

METRICS = ("accuracy", "macro_f1", "chunk_f1", "eval_loss")
LOWER_IS_BETTER = ("eval_loss",)


class BestCheckpoint(Callback):
    """Scores the model every ``every`` steps (``evaluate(model) -> {metric: value}``), keeps the best weights,
    and may stop the run early."""

    def __init__(self, model: nn.Module, evaluate: Callable[[nn.Module], dict[str, Any]], every: int, metric: str,
                 patience: int = 0) -> None:
        self.model, self.evaluate, self.every, self.metric, self.patience = model, evaluate, every, metric, patience
        self.sign = -1.0 if metric in LOWER_IS_BETTER else 1.0
        self.best_value: float | None = None
        self.best_step = 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.evals: list[dict[str, Any]] = []
        self.stale = 0

    def on_step(self, trainer: Any, step: int, record: dict[str, Any]) -> None:
        if step % self.every:
            return
        self.model.eval()
        with torch.no_grad():
            report = self.evaluate(self.model)
        self.model.train()
        value = float(report[self.metric])
        self.evals.append({"step": step, **{k: report[k] for k in METRICS if k in report}})
        if self.best_value is None or self.sign * value > self.sign * self.best_value:
            self.best_value, self.best_step, self.stale = value, step, 0
            self.best_state = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        else:
            self.stale += 1
            if self.patience and self.stale >= self.patience:
                trainer.stop_early = True  # the trainer saves this step and ends the run

    def restore_best(self) -> dict[str, Any] | None:
        """Put the best weights back; returns the report's ``best`` entry (None if never evaluated)."""
        if self.best_state is None:
            return None
        self.model.load_state_dict(self.best_state)
        return {"step": self.best_step, "metric": self.metric, "value": self.best_value}


def parameter_counts(model: nn.Module) -> dict[str, Any]:
    """Trainable parameters, all parameters, and their ratio to what full fine-tuning trains.

    Full fine-tuning trains every weight of the base model + head; LoRA/adapter parameters are extra.
    """
    from lmforge.nn.lora import is_delta_parameter

    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    delta = sum(p.numel() for n, p in model.named_parameters() if is_delta_parameter(n))
    full = total - delta - sum(p.numel() for n, p in model.named_parameters() if n.startswith("mix."))
    return {"trainable_params": trainable, "total_params": total, "full_finetune_params": full,
            "trainable_ratio": round(trainable / full, 6)}


class LastStepClock(Callback):
    """A trainer callback noting when the last logged step ended (the trainer logs the last step)."""

    last: float | None = None
    last_cpu: float | None = None

    def on_step(self, trainer: Any, step: int, record: dict[str, Any]) -> None:
        self.last, self.last_cpu = time.perf_counter(), time.process_time()


def memory_report(model: nn.Module, rss_before: int, device: torch.device) -> dict[str, int]:
    """What the run held in memory (bytes), stating what was measured.

    training_state_bytes: parameters + gradients + AdamW's two moments of the trainable ones (computed).
    peak_rss_bytes: the process's peak resident memory (ru_maxrss; includes loading and activations);
    peak_rss_delta_bytes: that peak minus the resident memory just before training; cuda_peak_bytes on GPU.
    """
    import resource

    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
    out = {"training_state_bytes": params + 3 * trainable, "peak_rss_bytes": peak,
           "peak_rss_delta_bytes": max(0, peak - rss_before)}
    if device.type == "cuda":
        out["cuda_peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return out


def current_rss() -> int:
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0
