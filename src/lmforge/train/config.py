"""The training configuration: the ``train:`` section of every recipe, declared once (``lmforge.schema``).

A recipe is one YAML file with a section per concern; the trainer reads ``train:``, the workflow builds
the model and the data from the others (``lmforge.workflows.pretrain_args``)::

    model: {preset: gpt-tiny, d_model: 128}
    data:  {objective: clm, files: [shakespeare], seq_len: 128}
    train: {lr: 6.0e-4, max_steps: 2000, batch_size: 16, schedule: cosine}

Each field of ``TrainConfig`` is a recipe key (``train.lr``), a KEY=VALUE override (``train.lr=1e-3``) and a
flag of ``lmforge pretrain`` (``--lr 1e-3``), checked by one checker (``lmforge.schema``). The resolved recipe
is saved beside the run as ``config.yaml`` (``save_recipe``).
"""

from __future__ import annotations

from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic
from lmforge.schema import build, check_section, diff_recipes, plain, setting

Schedule = Literal["cosine", "linear", "constant"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Optimizer = Literal["adamw", "muon"]


@dataclass
class TrainConfig:
    """Everything the training loop needs: the ``train:`` section of a recipe (``lmforge pretrain --help``).

    Steps count optimizer updates, from 1 to ``max_steps``. One update sees
    ``batch_size * grad_accum * world_size`` rows: ``batch_size`` rows per micro-batch per process.
    """

    # optimizer: AdamW, decoupled weight decay on matrices only (not on norms, biases, embeddings);
    # or Muon for the Transformer layers' matrices with AdamW (lr, betas, eps) for the rest (docs/modern.md)
    optimizer: Optimizer = setting("adamw", "adamw, or muon for the hidden matrices (+ AdamW for the rest)")
    muon_lr: float = setting(0.02, "Muon's peak learning rate; the schedule scales it like lr", above=0)
    muon_momentum: float = setting(0.95, "Muon's momentum", min=0, below=1)
    muon_weight_decay: float = setting(0.0, "Muon's decoupled weight decay (its own: AdamW's is weight_decay)", min=0)
    lr: float = setting(3e-4, "peak learning rate", above=0)
    min_lr: float = setting(0.0, "where cosine / linear decay ends, at max_steps", min=0)
    weight_decay: float = setting(0.1, "AdamW's decoupled weight decay, on matrices only", min=0)
    betas: tuple[float, float] = setting((0.9, 0.95), "AdamW's (beta1, beta2), each in [0, 1)")
    eps: float = setting(1e-8, "AdamW's epsilon", above=0)
    grad_clip: float = setting(1.0, "max global L2 norm of the gradients; 0 turns clipping off", min=0)
    # schedule: linear warmup from 0 to lr over warmup_steps, then decay to min_lr
    warmup_steps: int = setting(0, "linear warmup from 0 to lr over this many steps", min=0)
    max_steps: int = setting(1000, "optimizer updates", min=1, may_change=True)
    schedule: Schedule = setting("cosine", "decay after warmup: cosine, linear or constant")
    # batches
    batch_size: int = setting(8, "rows per micro-batch, per process", min=1)
    grad_accum: int = setting(1, "micro-batches per update", min=1)
    # evaluation, checkpoints, logs (0 turns a periodic event off; the last step always saves)
    eval_every: int = setting(0, "evaluate every N steps (0: off)", min=0, may_change=True)
    eval_batches: int = setting(0, "validation batches per evaluation (0: all of them)", min=0, may_change=True)
    save_every: int = setting(100, "checkpoint every N steps (0: only at the end)", min=0, may_change=True)
    keep_last: int = setting(3, "checkpoints kept on disk (0: all)", min=0, may_change=True)
    log_every: int = setting(10, "log a line every N steps (0: off)", min=0, may_change=True)
    progress: bool = setting(True, "a progress bar on standard error", may_change=True)
    tensorboard: bool = setting(False, "TensorBoard event files (needs lmforge[tensorboard])", may_change=True)
    plot: bool = setting(True, "draw run_dir/loss.png at each evaluation and at the end", may_change=True)
    # execution
    precision: Precision = setting("auto", "autocast: auto (bf16 on CUDA, else fp32), fp32, bf16, fp16")
    compile: bool | Literal["auto"] = setting("auto", "torch.compile the model: true, false or auto (on CUDA)")
    seed: int = setting(0, "random seed of initialisation, batches and dropout")
    device: str = setting("auto", "cpu | cuda | cuda:N | mps | auto (cuda:LOCAL_RANK when CUDA is there)",
                          metavar="DEV", may_change=True)
    ddp: bool = setting(True, "DistributedDataParallel when launched by torchrun with WORLD_SIZE > 1")
    fsdp: bool = setting(False, "shard parameters, gradients and optimizer state instead (large models)")
    dist_timeout: float = setting(600.0, "seconds a process waits for the others in a collective", above=0,
                                  may_change=True)

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  (YAML gives a list)
        check_section(TrainConfig, plain(self), "train")  # direct construction is checked like a recipe
        self.validate("train")

    def validate(self, section: str = "train") -> None:
        """The rules between fields (each field's own range is checked by the schema)."""
        if not 0 <= self.min_lr <= self.lr:
            raise LmforgeError(f"{section}.min_lr: must be between 0 and lr ({self.lr}), got {self.min_lr}")
        if self.warmup_steps and self.warmup_steps >= self.max_steps:
            raise LmforgeError(f"{section}.warmup_steps: must be smaller than max_steps ({self.max_steps}), got "
                               f"{self.warmup_steps}")
        if not all(0 <= b < 1 for b in self.betas):
            raise LmforgeError(f"{section}.betas: must be two numbers in [0, 1), got {list(self.betas)}")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None, section: str = "train") -> TrainConfig:
        """Build from a recipe section, checking every key and type (errors name ``train.key``)."""
        return build(cls, values, section)

    def to_dict(self) -> dict[str, Any]:
        return plain(self)


def save_recipe(recipe: dict[str, Any], path: str | Path) -> None:
    """Write the resolved recipe as YAML, atomically (temp file in the same directory, then rename)."""
    import yaml

    write_text_atomic(Path(path), yaml.safe_dump(plain(recipe), sort_keys=False))


def read_recipe(path: str | Path) -> dict[str, Any]:
    """A run's recorded config.yaml as plain sections ({} when there is none)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        return {}
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise LmforgeError(f"{path}: unreadable run record ({str(err).splitlines()[0]})") from None


def default_recipe(model: Any, config: TrainConfig) -> dict[str, Any]:
    """``{"model": <model.config as a dict, if any>, "train": config}``: what config.yaml holds by default."""
    recipe: dict[str, Any] = {}
    model_config = getattr(model, "config", None)
    if is_dataclass(model_config) and not isinstance(model_config, type):
        recipe["model"] = {"class": type(model).__name__, **plain(model_config)}
    recipe["train"] = config.to_dict()
    return recipe


__all__ = ["Optimizer", "Precision", "Schedule", "TrainConfig", "default_recipe", "diff_recipes", "read_recipe",
           "save_recipe"]
