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
``workflows/classify.py``, self-training's pseudo-labels ``workflows/self_training.py``). An ELMo biLM
(``models/elmo.py``, ``objective: bilm``) is a starting model too, for full and frozen (--mix: ELMo's
task-specific mix of its 2L + 1 representations).

With ``unlabeled`` set, self-training rounds follow the first fine-tuning (``self_train``): pseudo-label the
unlabeled texts, fine-tune the starting model again on labels + pseudo-labels.

    >>> result = finetune(FinetuneArgs(model="runs/bert-mini-ft/model", task="seq-cls", train="train.csv",
    ...                                eval="dev.csv", strategy="lora", out="runs/cls-lora"))  # doctest: +SKIP
    >>> result["trainable_ratio"], result["eval"]["accuracy"]                                    # doctest: +SKIP
    (0.0215, 0.846)
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.data import tasks
from lmforge.errors import LmforgeError
from lmforge.files import remove_tree, write_text_atomic
from lmforge.interop.directories import build_task_model, load_finetuned, save_finetuned, weights_sha256
from lmforge.models.strategies import StrategySpec, apply_strategy
from lmforge.outputs import claim_output
from lmforge.workflows import self_training
from lmforge.workflows.classify import encode, evaluate_model, predict_lines, probabilities
from lmforge.workflows.finetune_args import FINETUNE, REPORT_FILE, FinetuneArgs, train_config
from lmforge.workflows.finetune_eval import LastStepClock, current_rss, memory_report, parameter_counts

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
    if len(names) < 2:
        raise LmforgeError(f"{args.train}: every training example has the label {names[0]!r}: a classifier needs "
                           "at least two classes")
    if warning := tasks.sparse_labels(train_ex, args.train):
        print(f"lmforge: warning: {warning}", file=sys.stderr)
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


def fit(args: FinetuneArgs, train_ex: list, names: list[str], run_dir: Path, eval_ex: list | None = None
        ) -> tuple[nn.Module, Any, dict[str, Any]]:
    """Fine-tune the starting model on ``train_ex``: (trained model, tokenizer, what the report says of it).

    With ``args.eval_every`` the model is scored on ``eval_ex`` during training and the best weights are kept
    (``finetune_eval.BestCheckpoint``; early stopping with ``args.early_stopping``).
    """
    from lmforge.train.trainer import Trainer
    from lmforge.workflows.finetune_eval import BestCheckpoint

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
    best = None
    if args.eval_every and eval_ex:
        scoring = dict(tokenizer=tok, task=args.task, names=names, examples=eval_ex, max_len=max_len,
                       batch_size=args.eval_batch_size)
        best = BestCheckpoint(model, lambda m: evaluate_model(m, **scoring), args.eval_every, args.best_metric,
                              args.early_stopping)
    trainer = Trainer(model, source, config, run_dir, callbacks=[clock] + ([best] if best else []), recipe=recipe,
                      schema=FINETUNE,  # a resume compares settings completed with today's defaults (as sft's)
                      tokenizer_dir=args.model, model_info={"task": args.task, "labels": list(names)})
    rss_before = current_rss()
    start, start_cpu = time.perf_counter(), time.process_time()
    result = trainer.fit()
    train_s = (clock.last or time.perf_counter()) - start  # up to the last update, before the final checkpoint
    train_cpu = (clock.last_cpu or time.process_time()) - start_cpu  # CPU seconds: robust to a busy machine
    if not args.keep_checkpoints:
        remove_tree(run_dir / "checkpoints")
    kept = {}
    if best is not None:  # the saved model is the best one evaluated, not the last
        kept = {"best": best.restore_best(), "evals": best.evals,
                "stopped_early_at": result.step if result.step < steps else None}
    return model, tok, {**kept, "train_examples": len(train_ex), "steps": steps, "train_loss": result.loss,
                        "train_time_s": round(train_s, 2), "train_cpu_s": round(train_cpu, 2),
                        "threads": torch.get_num_threads(), "lr": config.lr, "batch_size": args.batch_size,
                        "max_len": max_len, **counts, **memory_report(model, rss_before, trainer.device)}


def score(args: FinetuneArgs, model: nn.Module, tok, names: list[str], eval_ex: list,
          png: Path | None) -> dict[str, Any]:
    """{"eval": metrics, "eval_time_s": seconds} on the evaluation examples (nothing without them)."""
    if not eval_ex:
        return {}
    start = time.perf_counter()
    max_len = min(args.max_len, model.config.max_positions)
    metrics = evaluate_model(model.eval(), tok, args.task, names, eval_ex, max_len, args.eval_batch_size, png)
    return {"eval": metrics, "eval_time_s": round(time.perf_counter() - start, 2)}


def self_train(args: FinetuneArgs, model: nn.Module, tok, names: list[str], train_ex: list, eval_ex: list,
               first: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """Rounds 1..R of self-training (``workflows/self_training.py``) after round 0 (``model``, ``first``).

    Returns the last round's model and the report: ``self_training.rounds`` lists, per round, the
    pseudo-labels added per class, their accuracy when the unlabeled file carries true labels, and the
    evaluation metrics; the top-level entries describe the last round.
    """
    out = Path(args.out)
    unlabeled = self_training.read_unlabeled(args.unlabeled, names)
    counts = [sum(ex.label == n for ex in train_ex) for n in names]
    report = first
    rounds = [_round_summary(0, first, {"pseudo_labels": 0, "pseudo_per_class": {}, "pseudo_accuracy": None}, 0.0)]
    for r in range(1, args.self_train_rounds + 1):
        start = time.perf_counter()
        max_len = min(args.max_len, model.config.max_positions)
        feats = encode(args.task, unlabeled, tok, names, max_len)
        probs = torch.stack(probabilities(model, feats, tok.pad_id, args.eval_batch_size,
                                          f"round {r}: labelling" if args.progress else None))  # (N, C)
        chosen = self_training.select_pseudo_labels(probs, counts, args.confidence, args.pseudo_ratio)
        pseudo = self_training.pseudo_report(unlabeled, chosen, names)
        kept = ", ".join(f"{n} {k}" for n, k in pseudo["pseudo_per_class"].items()) or "none"
        print(f"lmforge finetune: self-training round {r}: kept {len(chosen)} of {len(unlabeled)} pseudo-labels at "
              f"confidence >= {args.confidence} ({kept})" + ("; the round trains on the labeled data alone"
                                                             if not chosen else ""), file=sys.stderr)
        predict_s = time.perf_counter() - start
        del model
        model, tok, fitted = fit(args, train_ex + self_training.pseudo_examples(unlabeled, chosen, names), names,
                                 out / f"run-{r}", eval_ex)
        png = out / "confusion.png" if r == args.self_train_rounds else None
        report = {**first, **fitted, **score(args, model, tok, names, eval_ex, png)}
        rounds.append(_round_summary(r, report, pseudo, predict_s))
    report["self_training"] = {"unlabeled": str(args.unlabeled), "unlabeled_texts": len(unlabeled),
                               "confidence": args.confidence, "pseudo_ratio": args.pseudo_ratio,
                               "max_pseudo_labels": int(args.pseudo_ratio * len(train_ex)), "rounds": rounds}
    return model, report


def _round_summary(r: int, report: dict[str, Any], pseudo: dict[str, Any], predict_s: float) -> dict[str, Any]:
    metrics = {k: v for k, v in (report.get("eval") or {}).items() if isinstance(v, (int, float))}
    return {"round": r, **pseudo, "train_examples": report["train_examples"], "predict_time_s": round(predict_s, 2),
            "train_time_s": report["train_time_s"], "eval": metrics}


def finetune(args: FinetuneArgs) -> dict[str, Any]:
    """Train, evaluate and save one run into ``args.out``; returns the report also written to finetune.json.

    One run at a time holds ``out``; it checkpoints into ``out/run`` every ``save_every`` steps and on
    SIGINT / SIGTERM, and the same call again resumes from there. ``out`` is claimed first (``lmforge.outputs``):
    not the starting model's directory (nor inside it), no file there that lmforge did not write, and another
    output (another strategy) replaced only with ``overwrite``, its checkpoints (``out/run``) with it.
    With ``args.unlabeled``: self-training rounds follow (``self_train``); the last round's model is saved.
    """
    args.check()
    out = Path(args.out)
    identity = {"task": args.task, "strategy": args.strategy, "mix": args.mix, "merge": args.merge, "arch": args.arch}
    with claim_output(out, "finetune", identity, args.overwrite, inputs=[args.model]):
        return _finetune(args, out)


def _finetune(args: FinetuneArgs, out: Path) -> dict[str, Any]:
    if args.task == "chat":  # instruction tuning of a decoder: workflows/sft.py
        from lmforge.workflows.sft import finetune_chat

        return finetune_chat(args, out)
    train_ex, eval_ex, names = read_examples(args)
    if args.unlabeled:  # the file is checked before any training
        self_training.read_unlabeled(args.unlabeled, names)
    base_sha256 = weights_sha256(Path(args.model))  # the weights about to be read: what an adapter records
    model, tok, fitted = fit(args, train_ex, names, out / "run", eval_ex)
    last = args.unlabeled is None
    report: dict[str, Any] = {"model": str(args.model), "task": args.task, "strategy": args.strategy,
                              "mix": args.mix, "scratch": args.scratch, "labels": len(names), **fitted,
                              **score(args, model, tok, names, eval_ex, out / "confusion.png" if last else None)}
    if args.unlabeled:
        model, report = self_train(args, model, tok, names, train_ex, eval_ex, report)
    max_len = report["max_len"]
    spec = strategy_spec(args)
    info = {"task": args.task, "strategy": args.strategy, "labels": names, "base_model": str(args.model),
            "base_model_sha256": base_sha256, "max_len": max_len, "mix": args.mix,
            "lora": {"r": spec.lora_r, "alpha": spec.lora_alpha, "dropout": spec.lora_dropout,
                     "targets": list(spec.lora_targets)},
            "adapter": {"size": spec.adapter_size}}
    report["checkpoint_bytes"] = save_finetuned(model.cpu(), tok, out, info, merge=args.merge)
    write_text_atomic(out / REPORT_FILE, json.dumps(report, indent=1) + "\n")
    return report
