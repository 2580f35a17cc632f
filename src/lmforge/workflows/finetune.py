"""Fine-tuning a pretrained encoder on a labeled task, with one of four strategies.

    full      every weight trains                                       a full model directory
    frozen    the encoder is frozen, only the head trains               a full model directory
              (--mix: the head reads gamma * sum_j softmax(s)_j h_j)    adapter-only files
    lora      W x + (alpha / r) B A x on the attention projections      adapter-only files (A, B, head)
    adapter   bottleneck adapters after attention and feed-forward      adapter-only files (D, U, head)

The starting model is any encoder directory ``lmforge.load`` reads: an lmforge run's ``model/``, or a
Hugging Face BERT folder such as all-MiniLM-L6-v2's. Adapter-only outputs hold ``adapter.safetensors``
(the trained tensors only) and ``adapter_config.json`` (base model path, strategy, labels);
``lmforge.interop.directories.load_finetuned`` rebuilds either kind of output (the surgery itself is
``lmforge.models.strategies``, the settings ``workflows/finetune_args.py``, evaluation and prediction
``workflows/classify.py``). An ELMo biLM (``models/elmo.py``, ``objective: bilm``)
is a starting model too, for full and frozen (--mix: ELMo's task-specific mix of its 2L + 1 representations).

    >>> result = finetune(FinetuneArgs(model="runs/bert-mini-ft/model", task="seq-cls", train="train.csv",
    ...                                eval="dev.csv", strategy="lora", out="runs/cls-lora"))  # doctest: +SKIP
    >>> result["trainable_ratio"], result["eval"]["accuracy"]                                    # doctest: +SKIP
    (0.0215, 0.846)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.data import tasks
from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic
from lmforge.interop.directories import build_task_model, load_finetuned, save_finetuned
from lmforge.lock import RunLock
from lmforge.models.strategies import StrategySpec, apply_strategy
from lmforge.outputs import RECORD_NAME, claim_output, record_output
from lmforge.workflows.classify import encode, evaluate_model, predict_lines
from lmforge.workflows.finetune_args import CNN_LR, DEFAULT_LR, REPORT_FILE, FinetuneArgs

# The fine-tuning API in one place: train (finetune), reload (load_finetuned), score and predict.
__all__ = ["FinetuneArgs", "evaluate_model", "finetune", "load_finetuned", "parameter_counts", "predict_lines"]


def build_cnn_task_model(model_dir: str | Path, num_labels: int):
    """(fresh CNNForSequenceClassification, tokenizer): the CNN's vocabulary is ``model_dir``'s tokenizer."""
    from lmforge.models.cnn import cnn_classifier_for
    from lmforge.tokenizers import load_tokenizer

    if not any((Path(model_dir) / n).exists() for n in ("tokenizer.json", "vocab.txt")):
        raise LmforgeError(f"{model_dir}: no tokenizer (tokenizer.json or vocab.txt) for --arch cnn")
    tok = load_tokenizer(model_dir)
    if tok.pad_id is None:
        raise LmforgeError(f"{model_dir}: the tokenizer has no padding token")
    return cnn_classifier_for(tok, num_labels).train(), tok


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


class LastStepClock:
    """A trainer callback noting when the last logged step ended (the trainer logs the last step)."""

    last: float | None = None
    last_cpu: float | None = None

    def on_step(self, trainer: Any, step: int, record: dict[str, Any]) -> None:
        self.last, self.last_cpu = time.perf_counter(), time.process_time()

    def on_eval(self, *args: Any) -> None: ...

    def on_save(self, *args: Any) -> None: ...


# -- the run ----------------------------------------------------------------------------------------------
def strategy_spec(args: FinetuneArgs) -> StrategySpec:
    """The strategy part of the arguments (what a saved adapter records to rebuild the model)."""
    from lmforge.nn.lora import LORA_TARGETS

    return StrategySpec(strategy=args.strategy, mix=args.mix, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                        lora_dropout=args.lora_dropout, lora_targets=list(args.lora_targets or LORA_TARGETS),
                        adapter_size=args.adapter_size)


def read_examples(args: FinetuneArgs) -> tuple[list, list, list[str]]:
    """(training examples, evaluation examples, label names from the training set)."""
    train_ex = tasks.read_task(args.task, args.train)[: args.limit or None]
    names = tasks.label_names(train_ex)
    eval_ex = tasks.read_task(args.task, args.eval) if args.eval else []
    tasks.check_labels(eval_ex, names)
    return train_ex, eval_ex, names


def prepare_model(args: FinetuneArgs, num_labels: int) -> tuple[nn.Module, Any]:
    """(the model to train, wrapped for the strategy; its tokenizer). Seeded: head and LoRA A are random."""
    from lmforge.train.trainer import seed_everything

    seed_everything(args.seed)
    if args.arch == "cnn":
        model, tok = build_cnn_task_model(args.model, num_labels)
    else:
        model, tok = build_task_model(args.model, args.task, num_labels)
    if args.scratch:
        from lmforge.models.common import init_weights

        if hasattr(model.encoder, "reset_parameters"):  # a biLM re-initialises its LSTMs too
            model.encoder.reset_parameters()
        else:
            init_weights(model.encoder)
    return apply_strategy(model, strategy_spec(args)), tok


def train_config(args: FinetuneArgs, steps: int):
    """The trainer's settings for a fine-tuning run of ``steps`` optimizer steps (linear decay, warmup)."""
    from lmforge.train.config import TrainConfig

    lr = args.lr or (CNN_LR if args.arch == "cnn" else DEFAULT_LR[args.strategy])
    return TrainConfig(lr=lr, weight_decay=args.weight_decay, betas=(0.9, 0.999),
                       warmup_steps=int(args.warmup * steps), max_steps=steps, schedule="linear",
                       batch_size=args.batch_size, save_every=args.save_every, keep_last=1,
                       log_every=max(1, steps // 20),
                       progress=args.progress, tensorboard=False, seed=args.seed, device=args.device)


def finetune(args: FinetuneArgs) -> dict[str, Any]:
    """Train, evaluate and save one run into ``args.out``; returns the report also written to finetune.json.

    One run at a time holds ``out``; it checkpoints into ``out/run`` every ``save_every`` steps and on
    SIGINT / SIGTERM, and the same call again resumes from there. ``out`` may not be (or be inside) the
    starting model's directory, and replaces another output (another strategy) only with ``overwrite``.
    """
    args.check()
    out = Path(args.out)
    identity = {"task": args.task, "strategy": args.strategy, "mix": args.mix, "merge": args.merge, "arch": args.arch}
    if claim_output(out, "finetune", identity, args.overwrite, inputs=[args.model]):
        shutil.rmtree(out / "run", ignore_errors=True)  # the replaced output's checkpoints go with it
    with RunLock(out):
        report = _finetune(args, out)
        record_output(out, "finetune", identity, [p.name for p in out.iterdir() if p.is_file()
                                                  and p.name not in (RECORD_NAME, ".lock")])
    return report


def _finetune(args: FinetuneArgs, out: Path) -> dict[str, Any]:
    from lmforge.train.trainer import Trainer

    train_ex, eval_ex, names = read_examples(args)
    model, tok = prepare_model(args, len(names))
    max_len = min(args.max_len, model.config.max_positions)
    train_feats = encode(args.task, train_ex, tok, names, max_len, args.label_all)
    steps = args.max_steps or max(1, math.ceil(args.epochs * len(train_feats) / args.batch_size))
    config = train_config(args, steps)
    source = tasks.TaskSource(train_feats, args.batch_size, tok.pad_id, args.seed)
    recipe = {"model": {"base": str(args.model), "class": type(model).__name__},
              "finetune": {k: v for k, v in asdict(args).items() if k not in ("progress", "out")},
              "train": config.to_dict()}
    counts, clock = parameter_counts(model), LastStepClock()
    trainer = Trainer(model, source, config, out / "run", callbacks=[clock], recipe=recipe, tokenizer_dir=args.model,
                      model_info={"task": args.task, "labels": list(names)})  # checkpoints: evaluate --model
    rss_before = current_rss()
    start, start_cpu = time.perf_counter(), time.process_time()
    result = trainer.fit()
    train_s = (clock.last or time.perf_counter()) - start  # up to the last update, before the final checkpoint
    train_cpu = (clock.last_cpu or time.process_time()) - start_cpu  # CPU seconds: robust to a busy machine
    report: dict[str, Any] = {"model": str(args.model), "task": args.task, "strategy": args.strategy,
                              "mix": args.mix, "scratch": args.scratch, "labels": len(names),
                              "train_examples": len(train_ex), "steps": steps, "train_loss": result.loss,
                              "train_time_s": round(train_s, 2), "train_cpu_s": round(train_cpu, 2),
                              "threads": torch.get_num_threads(), "lr": config.lr, "batch_size": args.batch_size,
                              "max_len": max_len, **counts, **memory_report(model, rss_before, trainer.device)}
    if eval_ex:
        start = time.perf_counter()
        report["eval"] = evaluate_model(model.eval(), tok, args.task, names, eval_ex, max_len, args.eval_batch_size,
                                        out / "confusion.png")
        report["eval_time_s"] = round(time.perf_counter() - start, 2)
    spec = strategy_spec(args)
    info = {"task": args.task, "strategy": args.strategy, "labels": names, "base_model": str(args.model),
            "max_len": max_len, "mix": args.mix,
            "lora": {"r": spec.lora_r, "alpha": spec.lora_alpha, "dropout": spec.lora_dropout,
                     "targets": list(spec.lora_targets)},
            "adapter": {"size": spec.adapter_size}}
    report["checkpoint_bytes"] = save_finetuned(model.cpu(), tok, out, info, merge=args.merge)
    if not args.keep_checkpoints:
        shutil.rmtree(out / "run" / "checkpoints", ignore_errors=True)
    write_text_atomic(out / REPORT_FILE, json.dumps(report, indent=1) + "\n")
    return report
