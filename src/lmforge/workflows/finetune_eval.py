"""Evaluation during fine-tuning, the best checkpoint and early stopping, as Trainer users expect them.

Every ``eval_every`` steps the model is scored on the evaluation file (``classify.evaluate_model``). The
weights that scored best on ``best_metric`` (accuracy, macro_f1 or, for tagging with BIO labels, chunk_f1)
are kept and put back at the end, so the saved model is the best one seen, not the last; with
``early_stopping`` = P, training ends after P evaluations in a row without improvement. The report names the
step that was kept: ``{"best": {"step": 120, "metric": "macro_f1", "value": 0.87}, "evals": [...]}``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lmforge.train.trainer import Callback
from lmforge.workflows.classify import evaluate_model

METRICS = ("accuracy", "macro_f1", "chunk_f1")


class BestCheckpoint(Callback):
    """Scores the model every ``every`` steps, keeps the best weights, and may stop the run early."""

    def __init__(self, model: nn.Module, score: dict[str, Any], every: int, metric: str, patience: int = 0) -> None:
        self.model, self.score, self.every, self.metric, self.patience = model, score, every, metric, patience
        self.best_value: float | None = None
        self.best_step = 0
        self.best_state: dict[str, torch.Tensor] | None = None
        self.evals: list[dict[str, Any]] = []
        self.stale = 0

    def on_step(self, trainer: Any, step: int, record: dict[str, Any]) -> None:
        if step % self.every:
            return
        self.model.eval()
        report = evaluate_model(self.model, **self.score)
        self.model.train()
        value = float(report[self.metric])
        self.evals.append({"step": step, **{k: report[k] for k in METRICS if k in report}})
        if self.best_value is None or value > self.best_value:
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
