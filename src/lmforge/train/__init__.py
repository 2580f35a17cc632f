"""Training: the loop, AdamW and its schedule, atomic checkpoints and exact resume, DDP / FSDP.

    from lmforge.train import TrainConfig, Trainer
    config = TrainConfig(lr=1e-3, max_steps=200)
    result = Trainer(model, source, config, "runs/gpt").fit()

    trainer.py      the loop: one update per step, exact gradient accumulation, resumable at any step
    results.py      StepStats, TrainResult: what an update and a run give back
    resume.py       a run across restarts: the checkpoint it resumes from, the settings it may change
    config.py       TrainConfig, the train: section of every recipe (no torch)
    optim.py        AdamW with two parameter groups, Muon, the learning-rate schedule
    batches.py      the next update's batches on the device while the current one runs
    checkpoint.py   checkpoints that survive a crash at any instant: write everything, then rename
    distributed.py  DDP or FSDP under torchrun
    signals.py      SIGINT / SIGTERM stop at a step boundary and save
    logs.py         log.jsonl, TensorBoard events (optional), loss.png
    recompute.py    activation checkpointing: a layer's activations recomputed in the backward pass
    attention_kernel.py  on a GPU, the fused attention kernel a run uses, chosen by measurement at its start
    metrics.py      target counts (the weights of gradient accumulation) and evaluation metrics
    scores.py       classification scores: accuracy, macro-F1, per-class report, confusion matrix, chunk F1

See docs/training.md. Importing the package imports nothing heavy: each name loads its module on first use,
so that ``lmforge.train.config`` (the ``train:`` settings) is read at the command line's start-up without torch.
"""

from importlib import import_module

_HOMES = {"Checkpoint": "checkpoint", "latest_checkpoint": "checkpoint", "TrainConfig": "config",
          "save_recipe": "config", "count_targets": "metrics", "build_optimizer": "optim", "lr_at": "optim",
          "param_groups": "optim", "BatchSource": "batches", "Callback": "trainer", "Trainer": "trainer",
          "TrainResult": "results", "seed_everything": "checkpoint", "train": "trainer"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
