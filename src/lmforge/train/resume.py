"""A run across restarts: the checkpoint it resumes from and the settings it may change (``prepare_run``), what a
checkpoint gives back besides the weights (``restore_state``: the optimizer, the counters, the random streams),
and the last good checkpoint a message names (``last_good``).

config.yaml is the run's record: written at a new run's start; a resumed run with changed settings (allowed
ones only: the workflow's ``Recipe`` says which) rewrites it at its first checkpoint trained with them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.schema import Recipe, plain, refuse_changes
from lmforge.train import distributed as D
from lmforge.train.checkpoint import (
    Checkpoint,
    latest_checkpoint,
    restore_rng,
    seed_everything,
    warn_other_hardware,
)
from lmforge.train.config import read_recipe, save_recipe
from lmforge.train.logs import info


def prepare_run(run_dir: Path, env: D.DistEnv, recipe: dict[str, Any], schema: Recipe | None) -> \
        tuple[Checkpoint | None, bool]:
    """(the checkpoint to resume from or None, whether config.yaml must be rewritten at the next checkpoint):
    the newest checkpoint that verifies (rank 0 first removes what an interrupted save left), checked to be a run
    of these settings; config.yaml written for a new run. Collective: every process calls it."""
    saved_path = run_dir / "config.yaml"
    if env.is_main:  # rank 0 alone removes what an interrupted save left behind
        ckpt = latest_checkpoint(run_dir, clean=True, verify=True)
    D.barrier(env)
    if not env.is_main:
        ckpt = latest_checkpoint(run_dir, verify=True)
    if schema is not None:  # the workflow's policy: its fixed sections, its may-change keys
        changed = schema.resume_changes(saved_path, recipe)
    else:  # without one, only the trainer's own train: section may change
        changed = refuse_changes(saved_path, read_recipe(saved_path), plain(recipe),
                                 lambda key: not key.startswith("train.")) if saved_path.is_file() else []
    if changed and env.is_main:
        info(f"resuming with changed settings: {', '.join(changed)}")
    D.barrier(env)
    pending = False
    if env.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if not saved_path.is_file():
            save_recipe(recipe, saved_path)
        pending = bool(changed)
    return ckpt, pending


def restore_state(ckpt: Checkpoint, wrapped: nn.Module, optimizer: torch.optim.Optimizer,
                  scaler: torch.amp.GradScaler, env: D.DistEnv, device: torch.device, seed: int) -> \
        tuple[int, float | None, int | None]:
    """(tokens seen, best evaluation loss, its step) from ``ckpt``, with the optimizer's and scaler's state and each
    process's random streams restored (the weights were loaded before wrapping). A checkpoint of another number of
    processes restarts the streams from the seed and the step."""
    saved = ckpt.optimizer()
    try:
        D.load_optimizer_state(wrapped, optimizer, saved["optimizer"])
    except (ValueError, KeyError) as err:
        raise LmforgeError(f"{ckpt.path / 'optimizer.pt'}: does not fit this model's optimizer: {err}") from None
    if saved.get("scaler"):
        scaler.load_state_dict(saved["scaler"])
    st = ckpt.state
    if env.is_main:
        warn_other_hardware(st, device)
    rngs = st.get("rng") or []
    if len(rngs) == env.world_size:
        restore_rng(rngs[env.rank])
    else:
        if env.is_main:
            info(f"{ckpt.path.name} was saved by {len(rngs)} processes, this run has {env.world_size}: "
                 "random streams (dropout) restart from the seed")
        seed_everything(seed + env.rank + 1000 * ckpt.step)
    return int(st.get("tokens", 0)), st.get("best_eval_loss"), st.get("best_step")


def last_good(run_dir: Path) -> str:
    """The newest checkpoint of ``run_dir`` for a message ("the last good checkpoint is ...")."""
    ckpt = latest_checkpoint(run_dir) if run_dir.exists() else None
    return str(ckpt.path) if ckpt else "none (no checkpoint was written yet)"
