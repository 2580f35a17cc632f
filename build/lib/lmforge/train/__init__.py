"""Training: the loop, AdamW and its schedule, atomic checkpoints and exact resume, DDP / FSDP.

    from lmforge.train import TrainConfig, load_recipe, train
    recipe = load_recipe("configs/gpt-mini.yaml", ["train.lr=1e-3"])
    result = train(model, source, TrainConfig.from_dict(recipe["train"]), "runs/gpt", recipe=recipe)

See docs/training.md.
"""

from lmforge.train.checkpoint import Checkpoint, latest_checkpoint
from lmforge.train.config import TrainConfig, apply_overrides, load_recipe, save_recipe
from lmforge.train.metrics import count_targets
from lmforge.train.optim import build_optimizer, lr_at, param_groups
from lmforge.train.trainer import BatchSource, Callback, Trainer, TrainResult, seed_everything, train

__all__ = [
    "BatchSource",
    "Callback",
    "Checkpoint",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "apply_overrides",
    "build_optimizer",
    "count_targets",
    "latest_checkpoint",
    "load_recipe",
    "lr_at",
    "param_groups",
    "save_recipe",
    "seed_everything",
    "train",
]
