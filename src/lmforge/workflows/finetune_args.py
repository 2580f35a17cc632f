"""One fine-tuning run's settings: ``FinetuneArgs``, from flags or from a YAML recipe. No torch here.

Each field is a flag (``--lora-r 16``), a key of a recipe's ``finetune:`` section and a KEY=VALUE argument
(``finetune.lora_r=16``), declared once here (``lmforge.schema``); flags win over KEY=VALUE over the recipe::

    # configs/finetune-lora.yaml
    finetune: {task: seq-cls, strategy: lora, lora_r: 8, epochs: 3, weight_decay: 0.01, warmup: 0.1}

    lmforge finetune --config configs/finetune-lora.yaml --model DIR --train train.csv --out runs/cls \
        finetune.lr=3e-4
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lmforge.errors import LmforgeError
from lmforge.schema import Recipe, check_section, plain, setting

DEFAULT_LR = {"full": 5e-5, "frozen": 1e-3, "lora": 5e-4, "adapter": 5e-4}
CNN_LR = 2e-3  # a CNN trained from scratch takes larger steps than fine-tuning a pretrained encoder
REPORT_FILE = "finetune.json"


@dataclass
class FinetuneArgs:
    """One fine-tuning run: what to train, how, and where to put it (``lmforge finetune --help``).

    ``model``, ``task`` and ``train`` have no default: give them as flags or in the recipe.
    """

    model: str | None = setting(None, "starting model: an encoder or biLM directory (classification), a decoder "
                                "directory or .gguf file (chat)", metavar="DIR")
    task: Literal["seq-cls", "token-cls", "chat"] | None = setting(
        None, "seq-cls (a label per text) | token-cls (per word) | chat (instruction tuning of a decoder)")
    train: str | None = setting(None, "CSV / TSV / JSONL (seq-cls), word/TAG / CoNLL (token-cls), JSON lines of "
                                "messages or prompt/completion (chat)", metavar="FILE")
    strategy: Literal["full", "frozen", "lora", "adapter"] = setting("full", "full | frozen | lora | adapter")
    out: str = setting("runs/finetune", "output directory", metavar="DIR")
    eval: str | None = setting(None, "evaluation file in the training file's format", metavar="FILE")
    epochs: float = setting(2.0, "passes over the training set", above=0, may_change=True)
    max_steps: int = setting(0, "optimizer steps (0: from epochs)", min=0, may_change=True)
    batch_size: int = setting(16, "rows per step", min=1)
    micro_batch_size: int = setting(0, "chat: rows per forward pass, a divisor of --batch-size; the step's gradient "
                                    "is the same, the memory smaller (0: the most rows within 2,048 tokens)",
                                    min=0, may_change=True, metavar="N")
    activation_checkpointing: bool = setting(False, "chat: keep only each layer's input and recompute the rest in "
                                             "the backward pass (less memory, about 40% more time)",
                                             may_change=True)
    lr: float | None = setting(None, "peak learning rate (default: full 5e-5, frozen 1e-3, lora/adapter 5e-4)",
                               above=0, may_change=True)
    weight_decay: float = setting(0.01, "AdamW weight decay", min=0, may_change=True)
    warmup: float = setting(0.1, "share of the steps spent warming up", min=0, below=1, may_change=True)
    max_len: int = setting(128, "sub-word tokens per input, special tokens included", min=1)
    seed: int = setting(0, "random seed")
    mix: bool = setting(False, "frozen: the head reads a learned scalar mix of all layers")
    lora_r: int = setting(8, "LoRA rank r", min=1)
    lora_alpha: float = setting(16.0, "LoRA scale alpha (the update is alpha / r * B A)", above=0)
    lora_dropout: float = setting(0.05, "dropout on LoRA's input", min=0, below=1)
    lora_targets: list[str] | None = setting(None, "module patterns that get LoRA (default the attention "
                                             "projections: *.in_proj *.out_proj)", metavar="PATTERN")
    adapter_size: int = setting(64, "adapter bottleneck width", min=1)
    merge: bool = setting(False, "lora: fold the update into W and save a full model directory")
    label_all: bool = setting(False, "token-cls: label every sub-token, not only the first")
    packing: bool = setting(True, "chat: several conversations per row of max_len (attention kept within each)")
    limit: int = setting(0, "use only the first N training examples (0: all)", min=0, metavar="N")
    scratch: bool = setting(False, "re-initialise the encoder (no pretraining; a baseline)")
    arch: Literal["transformer", "cnn"] = setting("transformer", "transformer, or cnn: a fresh sentence CNN (seed "
                                                  "001 problem 3) with the model's tokenizer (seq-cls, full)")
    eval_batch_size: int = setting(64, "rows per evaluation batch", min=1, may_change=True)
    eval_every: int = setting(0, "score on eval every N steps and keep the best weights (0: only at the end)", min=0,
                              metavar="N")
    best_metric: Literal["accuracy", "macro_f1", "chunk_f1", "eval_loss"] = setting(
        "accuracy", "what 'best' means with eval_every (chat: always eval_loss)")
    early_stopping: int = setting(0, "with eval_every: stop after this many evaluations without improvement "
                                  "(0: never)", min=0, metavar="PATIENCE")
    device: str = setting("auto", "cpu | cuda | cuda:N | mps | auto", metavar="DEV", may_change=True)
    precision: Literal["fp32", "bf16", "fp16"] = setting("fp32", "autocast precision")
    compile: bool = setting(False, "torch.compile the model")
    progress: bool = setting(True, "a progress bar on standard error", may_change=True)
    keep_checkpoints: bool = setting(False, "keep OUT/run's checkpoints after the run", may_change=True)
    unlabeled: str | None = setting(None, "self-training: texts to pseudo-label, one a line (or CSV / JSONL)",
                                    metavar="FILE")
    self_train_rounds: int = setting(1, "rounds of pseudo-labeling and re-training", min=1)
    confidence: float = setting(0.9, "keep a pseudo-label when its top probability >= C", above=0, max=1)
    pseudo_ratio: float = setting(1.0, "at most this many pseudo-labels per labeled example", above=0)
    save_every: int = setting(100, "checkpoint every N steps (and on SIGINT / SIGTERM); rerunning resumes",
                              min=0, may_change=True)
    overwrite: bool = setting(False, "replace another fine-tuning output (another strategy) in out: only the files "
                              "its lmforge-output.json lists; files lmforge did not write are never removed",
                              may_change=True)

    def validate(self, section: str = "finetune") -> None:
        """The rules between fields (each field's own type and range are the schema's)."""
        for key in ("model", "task", "train"):
            if not getattr(self, key):
                raise LmforgeError(f"--{key}: required (as a flag or as {section}.{key} in the recipe)")
        rules = [
            (self.mix and self.strategy != "frozen", "--mix goes with --strategy frozen"),
            (self.merge and self.strategy != "lora", "--merge goes with --strategy lora"),
            ((self.eval_every or self.early_stopping) and not self.eval,
             "--eval-every / --early-stopping: give --eval FILE to evaluate on"),
            (self.early_stopping and not self.eval_every, "--early-stopping: needs --eval-every N (how often to "
             "evaluate)"),
            (self.best_metric == "chunk_f1" and self.task != "token-cls",
             "--best-metric chunk_f1 goes with --task token-cls (BIO tags)"),
            (self.arch == "cnn" and (self.task, self.strategy, self.scratch) != ("seq-cls", "full", False),
             "--arch cnn trains a new model: it goes with --task seq-cls --strategy full"),
            (self.unlabeled is not None and self.task != "seq-cls", "--unlabeled: self-training supports --task "
             "seq-cls only (a token-cls pseudo-label would need a confidence per word)"),
            (self.task == "chat" and (self.mix or self.arch != "transformer" or self.scratch),
             "--task chat tunes a decoder as it is: no --mix, --arch cnn or --scratch"),
            ((self.micro_batch_size or self.activation_checkpointing) and self.task != "chat",
             "--micro-batch-size / --activation-checkpointing go with --task chat"),
            (self.micro_batch_size and self.batch_size % self.micro_batch_size,
             f"--micro-batch-size {self.micro_batch_size} must divide --batch-size {self.batch_size}"),
        ]
        for broken, message in rules:
            if broken:
                raise LmforgeError(message)

    def check(self) -> None:
        """The same checks for an object built in Python (``FinetuneArgs(model=..., ...)``)."""
        check_section(FinetuneArgs, plain(self), "finetune")
        self.validate()


FINETUNE = Recipe({"finetune": FinetuneArgs}, fixed=("finetune",))


TOKENS_PER_PASS = 2048  # chat: tokens per forward pass by default (docs/finetuning.md#memory)


def micro_batches(args: FinetuneArgs, max_len: int) -> tuple[int, int]:
    """(rows per forward pass, passes per step): ``--micro-batch-size``, or the most rows of ``max_len`` tokens
    within TOKENS_PER_PASS that divide ``--batch-size`` (at least 1). The trainer weights each pass by its targets,
    so the step's loss and gradient are the batch's (train/metrics.py); only the activations kept shrink.

    >>> micro_batches(FinetuneArgs(batch_size=16), 512), micro_batches(FinetuneArgs(batch_size=16), 128)
    ((4, 4), (16, 1))
    """
    rows = args.micro_batch_size or max(d for d in range(1, args.batch_size + 1)
                                        if args.batch_size % d == 0 and (d == 1 or d * max_len <= TOKENS_PER_PASS))
    return rows, args.batch_size // rows


def train_config(args: FinetuneArgs, steps: int, grad_accum: int = 1):
    """The trainer's settings for a fine-tuning run of ``steps`` optimizer steps (linear decay, warmup), each of
    ``grad_accum`` passes of ``batch_size / grad_accum`` rows."""
    import math

    from lmforge.train.config import TrainConfig

    lr = args.lr or (CNN_LR if args.arch == "cnn" else DEFAULT_LR[args.strategy])
    base = max(1, steps // 20)  # about 20 log lines a run, on every evaluation step too
    return TrainConfig(lr=lr, weight_decay=args.weight_decay, betas=(0.9, 0.999),
                       warmup_steps=int(args.warmup * steps), max_steps=steps, schedule="linear",
                       batch_size=args.batch_size // grad_accum, grad_accum=grad_accum,
                       save_every=args.save_every, keep_last=1,
                       log_every=math.gcd(args.eval_every, base) if args.eval_every else base,
                       progress=args.progress, tensorboard=False, seed=args.seed, device=args.device,
                       precision=args.precision, compile=args.compile)
