"""What training gives back: the numbers of one update (``StepStats``, left on the device until a log step reads
them) and of a whole run (``TrainResult``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class StepStats:
    """One update's numbers, left on the device: reading one makes the host wait, so only log steps do."""

    loss: torch.Tensor  # () float64: mean over all the update's targets, all processes
    grad_norm: torch.Tensor  # () global L2 norm of the gradients, before clipping
    lr: float


@dataclass
class TrainResult:
    step: int  # the last step trained (= max_steps)
    loss: float  # training loss of the last step (mean over its targets)
    tokens: int  # input tokens seen by all processes since step 1
    eval: dict[str, float]  # metrics of the last evaluation ({} if the source has no validation set)
    best_eval_loss: float | None
    checkpoint: Path | None  # the final checkpoint
    resumed_from: int | None  # the step of the checkpoint this call resumed from
