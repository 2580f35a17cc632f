"""One fine-tuning run's settings: ``FinetuneArgs``, from flags or from a YAML recipe. No torch here.

``lmforge finetune`` reads the same recipes as ``lmforge pretrain``: a YAML file whose ``finetune:``
section holds any field below, then ``key=value`` overrides, then the command's flags (shortcuts)::

    # configs/finetune-lora.yaml
    finetune: {task: seq-cls, strategy: lora, lora_r: 8, epochs: 3, weight_decay: 0.01, warmup: 0.1}

    lmforge finetune --config configs/finetune-lora.yaml --model DIR --train train.csv --out runs/cls \
        finetune.lr=3e-4
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from lmforge.errors import LmforgeError

ARCHS = ("transformer", "cnn")  # cnn: a fresh sentence CNN (models/cnn.py) on the tokenizer's vocabulary
DEFAULT_LR = {"full": 5e-5, "frozen": 1e-3, "lora": 5e-4, "adapter": 5e-4}
CNN_LR = 2e-3  # a CNN trained from scratch takes larger steps than fine-tuning a pretrained encoder
REPORT_FILE = "finetune.json"


@dataclass
class FinetuneArgs:
    """One fine-tuning run: what to train, how, and where to put it (``lmforge finetune --help``)."""

    model: str
    task: str
    train: str
    strategy: str = "full"
    out: str = "runs/finetune"
    eval: str | None = None
    epochs: float = 2.0
    max_steps: int = 0  # 0: derived from epochs
    batch_size: int = 16
    lr: float | None = None  # default per strategy (DEFAULT_LR)
    weight_decay: float = 0.01
    warmup: float = 0.1  # share of the steps
    max_len: int = 128
    seed: int = 0
    mix: bool = False  # frozen: a learned scalar mix of all layers feeds the head
    lora_r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    lora_targets: list[str] | None = None  # None: lmforge.nn.lora.LORA_TARGETS (the attention projections)
    adapter_size: int = 64
    merge: bool = False  # lora: fold the update into W and save a full model directory
    label_all: bool = False  # token-cls: label every sub-token, not only the first
    limit: int = 0  # use only the first N training examples (0: all)
    scratch: bool = False  # re-initialise the encoder: the same model and tokenizer, no pretraining
    arch: str = "transformer"  # "cnn": train a fresh SentenceCNN with --model's tokenizer instead
    eval_batch_size: int = 64
    eval_every: int = 0  # evaluate on --eval every N steps (0: only at the end)
    best_metric: str = "accuracy"  # with eval_every: keep the best weights by accuracy | macro_f1 | chunk_f1
    early_stopping: int = 0  # with eval_every: stop after this many evaluations without improvement (0: never)
    device: str = "auto"
    precision: str = "fp32"  # autocast: fp32 | bf16 | fp16
    compile: bool = False  # torch.compile the model
    progress: bool = True
    keep_checkpoints: bool = False
    unlabeled: str | None = None  # self-training: texts to pseudo-label (workflows/self_training.py)
    self_train_rounds: int = 1  # rounds of pseudo-labeling after the first fine-tuning
    confidence: float = 0.9  # a pseudo-label needs its top class probability >= this
    pseudo_ratio: float = 1.0  # at most this many pseudo-labels per labeled example
    save_every: int = 100  # checkpoint every N steps (and on SIGINT / SIGTERM); rerunning resumes from it
    overwrite: bool = False  # replace another fine-tuning output (another strategy) found in out

    def check(self) -> None:
        from lmforge.data.tasks import TASKS
        from lmforge.models.strategies import STRATEGIES

        if self.strategy not in STRATEGIES:
            raise LmforgeError(f"--strategy: {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if self.task not in TASKS:
            raise LmforgeError(f"--task: {self.task!r} is not one of {', '.join(TASKS)}")
        if self.mix and self.strategy != "frozen":
            raise LmforgeError("--mix goes with --strategy frozen")
        if self.merge and self.strategy != "lora":
            raise LmforgeError("--merge goes with --strategy lora")
        if (self.eval_every or self.early_stopping) and not self.eval:
            raise LmforgeError("--eval-every / --early-stopping: give --eval FILE to evaluate on")
        if self.early_stopping and not self.eval_every:
            raise LmforgeError("--early-stopping: needs --eval-every N (how often to evaluate)")
        if self.best_metric not in ("accuracy", "macro_f1", "chunk_f1"):
            raise LmforgeError(f"--best-metric: {self.best_metric!r} is not one of accuracy, macro_f1, chunk_f1")
        if self.best_metric == "chunk_f1" and self.task != "token-cls":
            raise LmforgeError("--best-metric chunk_f1 goes with --task token-cls (BIO tags)")
        if self.arch not in ARCHS:
            raise LmforgeError(f"--arch: {self.arch!r} is not one of {', '.join(ARCHS)}")
        if self.arch == "cnn" and (self.task, self.strategy, self.scratch) != ("seq-cls", "full", False):
            raise LmforgeError("--arch cnn trains a new model: it goes with --task seq-cls --strategy full")
        if self.unlabeled is not None:
            if self.task != "seq-cls":
                raise LmforgeError("--unlabeled: self-training supports --task seq-cls only (a token-cls "
                                   "pseudo-label would need a confidence per word)")
            if self.self_train_rounds < 1:
                raise LmforgeError(f"--self-train-rounds: {self.self_train_rounds}; give 1 or more")
            if not 0.0 < self.confidence <= 1.0:
                raise LmforgeError(f"--confidence: {self.confidence}; give a probability in (0, 1]")
            if self.pseudo_ratio <= 0:
                raise LmforgeError(f"--pseudo-ratio: {self.pseudo_ratio}; give a positive multiple")
        if not 0 <= self.warmup < 1:
            raise LmforgeError(f"--warmup: invalid value {self.warmup!r}: a share of the steps, in [0, 1)")
        if self.save_every < 0:
            raise LmforgeError(f"--save-every: invalid value {self.save_every!r}: must be >= 0 (0: only at the end)")

    @classmethod
    def from_recipe(cls, recipe: dict[str, Any], flags: dict[str, Any]) -> FinetuneArgs:
        """The recipe's ``finetune:`` section (already type-checked by load_recipe), then the flags given."""
        import typing

        from lmforge.train.config import coerce

        section = dict(recipe.get("finetune") or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(section) - known)
        if unknown:
            raise LmforgeError(f"finetune.{unknown[0]}: unknown key; known keys are {', '.join(sorted(known))}")
        hints = typing.get_type_hints(cls)
        section = {k: coerce(v, hints[k], f"finetune.{k}") for k, v in section.items()}
        section.update({k: v for k, v in flags.items() if v is not None})
        for key in ("model", "task", "train"):
            if not section.get(key):
                raise LmforgeError(f"--{key}: required (as a flag or as finetune.{key} in the recipe)")
        return cls(**section)
