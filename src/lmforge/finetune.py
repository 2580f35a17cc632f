"""Fine-tuning a pretrained encoder on a labeled task, with one of four strategies.

    full      every weight trains                                       a full model directory
    frozen    the encoder is frozen, only the head trains               a full model directory
              (--mix: the head reads gamma * sum_j softmax(s)_j h_j)    adapter-only files
    lora      W x + (alpha / r) B A x on the attention projections      adapter-only files (A, B, head)
    adapter   bottleneck adapters after attention and feed-forward      adapter-only files (D, U, head)

The starting model is any encoder directory ``lmforge.load`` reads: an lmforge run's ``model/``, or a
Hugging Face BERT folder such as all-MiniLM-L6-v2's. Adapter-only outputs hold ``adapter.safetensors``
(the trained tensors only) and ``adapter_config.json`` (base model path, strategy, labels);
``load_finetuned`` rebuilds either kind of output. An ELMo biLM (``models/elmo.py``, ``objective: bilm``)
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.data import tasks
from lmforge.errors import LmforgeError
from lmforge.nn.lora import ADAPTER_TARGETS, LORA_TARGETS, inject_adapters, inject_lora, mark_trainable

STRATEGIES = ("full", "frozen", "lora", "adapter")
ARCHS = ("transformer", "cnn")  # cnn: a fresh sentence CNN (models/cnn.py) on the tokenizer's vocabulary
DEFAULT_LR = {"full": 5e-5, "frozen": 1e-3, "lora": 5e-4, "adapter": 5e-4}
CNN_LR = 2e-3  # a CNN trained from scratch takes larger steps than fine-tuning a pretrained encoder
ADAPTER_FILE, ADAPTER_CONFIG, REPORT_FILE = "adapter.safetensors", "adapter_config.json", "finetune.json"


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
    lora_targets: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    adapter_size: int = 64
    merge: bool = False  # lora: fold the update into W and save a full model directory
    label_all: bool = False  # token-cls: label every sub-token, not only the first
    limit: int = 0  # use only the first N training examples (0: all)
    scratch: bool = False  # re-initialise the encoder: the same model and tokenizer, no pretraining
    arch: str = "transformer"  # "cnn": train a fresh SentenceCNN with --model's tokenizer instead
    eval_batch_size: int = 64
    device: str = "auto"
    progress: bool = True
    keep_checkpoints: bool = False

    def check(self) -> None:
        if self.strategy not in STRATEGIES:
            raise LmforgeError(f"--strategy: {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if self.task not in tasks.TASKS:
            raise LmforgeError(f"--task: {self.task!r} is not one of {', '.join(tasks.TASKS)}")
        if self.mix and self.strategy != "frozen":
            raise LmforgeError("--mix goes with --strategy frozen")
        if self.merge and self.strategy != "lora":
            raise LmforgeError("--merge goes with --strategy lora")
        if self.arch not in ARCHS:
            raise LmforgeError(f"--arch: {self.arch!r} is not one of {', '.join(ARCHS)}")
        if self.arch == "cnn" and (self.task, self.strategy, self.scratch) != ("seq-cls", "full", False):
            raise LmforgeError("--arch cnn trains a new model: it goes with --task seq-cls --strategy full")


# -- building ---------------------------------------------------------------------------------------------
def load_tokenizer_for(model_dir: str | Path, config: Any, tokenizer_dir: str | Path | None = None):
    """The model's tokenizer (or ``tokenizer_dir``'s), checked against the model's vocabulary."""
    from lmforge.tokenizers import load_tokenizer

    where = Path(tokenizer_dir or model_dir)
    if not any((where / n).exists() for n in ("tokenizer.json", "vocab.txt")):
        raise LmforgeError(f"{where}: no tokenizer (tokenizer.json or vocab.txt)")
    tok = load_tokenizer(where)
    if tok.vocab_size != config.vocab_size:
        raise LmforgeError(f"{where}: the tokenizer has {tok.vocab_size} tokens but the model {model_dir} "
                           f"expects vocab_size {config.vocab_size}: tokenizer and model do not match")
    if tok.pad_id is None:
        raise LmforgeError(f"{where}: the tokenizer has no padding token")
    return tok


def build_task_model(model_dir: str | Path, task: str, num_labels: int, tokenizer_dir: str | Path | None = None):
    """(task model with a fresh head, tokenizer): the encoder of ``model_dir`` under a classification head."""
    import lmforge
    from lmforge.models import Encoder, EncoderForSequenceClassification, EncoderForTokenClassification
    from lmforge.models.elmo import BiLM, bilm_task_model

    base, _ = lmforge.load(model_dir, tokenizer=False)
    bilm = base if isinstance(base, BiLM) else getattr(base, "encoder", None)
    if isinstance(bilm, BiLM):  # ELMo: a head on the biLM's top layer, or on its scalar mix (--mix)
        tok = load_tokenizer_for(model_dir, bilm.config, tokenizer_dir)
        return bilm_task_model(bilm, task, num_labels).train(), tok
    encoder = base if isinstance(base, Encoder) else getattr(base, "encoder", None)
    if not isinstance(encoder, Encoder):
        raise LmforgeError(f"{model_dir}: a {type(base).__name__} is not a BERT-style encoder; "
                           "fine-tuning needs one")
    tok = load_tokenizer_for(model_dir, encoder.config, tokenizer_dir)
    cls = EncoderForSequenceClassification if task == "seq-cls" else EncoderForTokenClassification
    model = cls(encoder.config, num_labels)
    model.encoder = encoder
    return model.train(), tok


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


def apply_strategy(model: nn.Module, args: FinetuneArgs) -> nn.Module:
    """Wrap / freeze ``model`` for the strategy; returns the module to train (a wrapper for --mix)."""
    from lmforge.models.elmo import BiLMForTokenClassification, apply_bilm_strategy

    if isinstance(model, BiLMForTokenClassification):  # either biLM task model (seq-cls is a subclass)
        return apply_bilm_strategy(model, args.strategy, args.mix)
    if args.strategy == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    if args.strategy == "frozen" and args.mix:
        from lmforge.nn.mix import MixedFeatureModel

        model = MixedFeatureModel(model)
        mark_trainable(model, ("model.head.", "mix."))
        return model
    if args.strategy == "lora":
        try:
            inject_lora(model.encoder, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets)
        except ValueError as err:
            raise LmforgeError(f"--lora-targets: {err}") from None
    elif args.strategy == "adapter":
        inject_adapters(model.encoder, args.adapter_size, ADAPTER_TARGETS)
    mark_trainable(model, ("head.",))
    return model


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
def encode(task: str, examples, tokenizer, names, max_len: int, label_all: bool = False):
    if task == "seq-cls":
        return tasks.encode_classification(examples, tokenizer, names, max_len)
    return tasks.encode_tokens(examples, tokenizer, names, max_len, label_all)


def finetune(args: FinetuneArgs) -> dict[str, Any]:
    """Train, evaluate and save one run into ``args.out``; returns the report also written to finetune.json."""
    from lmforge.train.config import TrainConfig
    from lmforge.train.trainer import Trainer, seed_everything

    args.check()
    out = Path(args.out)
    train_ex = tasks.read_task(args.task, args.train)[: args.limit or None]
    names = tasks.label_names(train_ex)
    eval_ex = tasks.read_task(args.task, args.eval) if args.eval else []
    tasks.check_labels(eval_ex, names)
    seed_everything(args.seed)  # the head and LoRA A are initialised from the seed
    if args.arch == "cnn":
        model, tok = build_cnn_task_model(args.model, len(names))
    else:
        model, tok = build_task_model(args.model, args.task, len(names))
    if args.scratch:
        from lmforge.models.common import init_weights

        if hasattr(model.encoder, "reset_parameters"):  # a biLM re-initialises its LSTMs too
            model.encoder.reset_parameters()
        else:
            init_weights(model.encoder)
    max_len = min(args.max_len, model.config.max_positions)
    model = apply_strategy(model, args)
    train_feats = encode(args.task, train_ex, tok, names, max_len, args.label_all)
    steps = args.max_steps or max(1, math.ceil(args.epochs * len(train_feats) / args.batch_size))
    lr = args.lr or (CNN_LR if args.arch == "cnn" else DEFAULT_LR[args.strategy])
    config = TrainConfig(lr=lr, weight_decay=args.weight_decay,
                         betas=(0.9, 0.999), warmup_steps=int(args.warmup * steps), max_steps=steps,
                         schedule="linear", batch_size=args.batch_size, save_every=0, keep_last=1,
                         log_every=max(1, steps // 20), progress=args.progress, tensorboard=False,
                         seed=args.seed, device=args.device)
    source = tasks.TaskSource(train_feats, args.batch_size, tok.pad_id, args.seed)
    recipe = {"model": {"base": str(args.model), "class": type(model).__name__},
              "finetune": {k: v for k, v in asdict(args).items() if k not in ("progress", "out")},
              "train": config.to_dict()}
    counts = parameter_counts(model)
    clock = LastStepClock()
    trainer = Trainer(model, source, config, out / "run", callbacks=[clock], recipe=recipe)
    rss_before = current_rss()
    start, start_cpu = time.perf_counter(), time.process_time()
    result = trainer.fit()
    train_s = (clock.last or time.perf_counter()) - start  # up to the last update, before the final checkpoint
    train_cpu = (clock.last_cpu or time.process_time()) - start_cpu  # CPU seconds: robust to a busy machine
    memory = memory_report(model, rss_before, trainer.device)
    report: dict[str, Any] = {"model": str(args.model), "task": args.task, "strategy": args.strategy,
                              "mix": args.mix, "scratch": args.scratch, "labels": len(names),
                              "train_examples": len(train_ex),
                              "steps": steps, "train_loss": result.loss, "train_time_s": round(train_s, 2),
                              "train_cpu_s": round(train_cpu, 2), "threads": torch.get_num_threads(),
                              "lr": config.lr, "batch_size": args.batch_size, "max_len": max_len, **counts, **memory}
    if eval_ex:
        start = time.perf_counter()
        metrics = evaluate_model(model.eval(), tok, args.task, names, eval_ex, max_len, args.eval_batch_size,
                                 out / "confusion.png")
        report["eval_time_s"] = round(time.perf_counter() - start, 2)
        report["eval"] = metrics
    info = {"task": args.task, "strategy": args.strategy, "labels": names, "base_model": str(args.model),
            "max_len": max_len, "mix": args.mix, "lora": {"r": args.lora_r, "alpha": args.lora_alpha,
                                                          "dropout": args.lora_dropout,
                                                          "targets": list(args.lora_targets)},
            "adapter": {"size": args.adapter_size}}
    report["checkpoint_bytes"] = save_finetuned(model.cpu(), tok, out, info, merge=args.merge)
    if not args.keep_checkpoints:
        shutil.rmtree(out / "run" / "checkpoints", ignore_errors=True)
    (out / REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return report


# -- saving and loading -----------------------------------------------------------------------------------
def save_finetuned(model: nn.Module, tokenizer, out: Path, info: dict[str, Any], merge: bool = False) -> int:
    """Write the run's model into ``out``; returns the checkpoint's size in bytes.

    full / frozen / --merge: a full model directory (config.json with task and labels, model.safetensors,
    tokenizer). lora / adapter / frozen --mix: adapter.safetensors (trained tensors only, head included),
    adapter_config.json and the tokenizer; the base model is read from its own directory at load time.
    """
    from lmforge.models.registry import WEIGHTS_NAME, save_pretrained, save_weights
    from lmforge.nn.lora import remove_wrappers, trainable_state_dict

    out.mkdir(parents=True, exist_ok=True)
    if merge:
        remove_wrappers(model)
    if not merge and (info["strategy"] in ("lora", "adapter") or info["mix"]):
        save_weights(trainable_state_dict(model), out / ADAPTER_FILE)
        base = Path(info["base_model"])
        meta = {"format": "lmforge-adapter", "version": 1, **info, "base_model": str(base.resolve())}
        (out / ADAPTER_CONFIG).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        tokenizer.save(out)
        return (out / ADAPTER_FILE).stat().st_size
    save_pretrained(model, out, tokenizer, extra={"task": info["task"], "labels": list(info["labels"])})
    return (out / WEIGHTS_NAME).stat().st_size


def load_finetuned(path: str | Path, device: str | None = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, info with task and labels) from any fine-tuned directory.

    Adapter-only directories are rebuilt: load the base model, wrap it as in training, load the trained
    tensors, merge LoRA (inference then costs what the base model costs). Full directories load directly;
    a Hugging Face ``BertFor{Sequence,Token}Classification`` folder works too (labels from id2label).
    """
    import lmforge
    from lmforge.models.config import read_json
    from lmforge.models.registry import load_weights, read_weights
    from lmforge.nn.lora import merge_lora

    folder = Path(path)
    if (folder / ADAPTER_CONFIG).is_file():
        info = read_json(folder / ADAPTER_CONFIG)
        for key in ("base_model", "strategy", "task", "labels"):
            if key not in info:
                raise LmforgeError(f"{folder / ADAPTER_CONFIG}: missing field {key!r}")
        lora, adapter = info.get("lora") or {}, info.get("adapter") or {}
        args = FinetuneArgs(model=info["base_model"], task=info["task"], train="", strategy=info["strategy"],
                            mix=bool(info.get("mix")), lora_r=lora.get("r", 8), lora_alpha=lora.get("alpha", 16.0),
                            lora_targets=lora.get("targets", list(LORA_TARGETS)), adapter_size=adapter.get("size", 64))
        tok_dir = folder if (folder / "tokenizer.json").is_file() else None
        model, tok = build_task_model(info["base_model"], info["task"], len(info["labels"]), tok_dir)
        model = apply_strategy(model, args)
        tensors = read_weights(folder / ADAPTER_FILE)
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        missing = sorted(trained - set(tensors))
        if missing:
            raise LmforgeError(f"{folder / ADAPTER_FILE}: missing tensor {missing[0]!r} for this {args.strategy} model")
        load_weights(model, tensors, str(folder / ADAPTER_FILE), optional=("",))
        merge_lora(model)
    else:
        model, tok = lmforge.load(folder)
        if tok is None:
            raise LmforgeError(f"{folder}: no tokenizer (tokenizer.json or vocab.txt)")
        data = read_json(folder / "config.json")
        kind = type(model).__name__
        if "Classification" not in kind:
            raise LmforgeError(f"{folder}: a {kind} has no classification head; fine-tune it first "
                               "(lmforge finetune --model DIR ...)")
        id2label = data.get("id2label") or {}
        names = data.get("labels") or [id2label.get(str(i), f"LABEL_{i}") for i in range(model.num_labels)]
        info = {"task": "seq-cls" if "Sequence" in kind else "token-cls", "labels": list(names),
                "max_len": model.config.max_positions}
    if device is not None:
        model.to(device)
    return model.eval(), tok, info


# -- evaluation and prediction ----------------------------------------------------------------------------
@torch.no_grad()
def probabilities(model: nn.Module, features, pad_id: int, batch_size: int = 64) -> list[torch.Tensor]:
    """softmax of the logits per feature: (C,) for seq-cls, (T_i, C) for token-cls (padding cut off).

    Rows are batched in order of length (little padding) and returned in their original order.
    """
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(features)), key=lambda i: len(features[i].input_ids))
    out: list[torch.Tensor | None] = [None] * len(features)
    for start in range(0, len(order), batch_size):
        rows = order[start: start + batch_size]
        batch = tasks.collate([features[i] for i in rows], pad_id)
        batch.pop("labels", None)
        probs = torch.softmax(model(**{k: v.to(device) for k, v in batch.items()}).logits.float(), -1).cpu()
        for k, i in enumerate(rows):
            out[i] = probs[k] if probs.dim() == 2 else probs[k, : len(features[i].input_ids)]
    return out  # type: ignore[return-value]


def evaluate_model(model: nn.Module, tokenizer, task: str, names: list[str], examples, max_len: int,
                   batch_size: int = 64, png: Path | None = None) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class report and confusion matrix (+ token accuracy and chunk F1 for tags)."""
    from lmforge.metrics import chunk_f1, classification_report, is_bio

    tasks.check_labels(examples, names)
    index = {n: i for i, n in enumerate(names)}
    features = encode(task, examples, tokenizer, names, max_len)
    probs = probabilities(model, features, tokenizer.pad_id, batch_size)
    if task == "seq-cls":
        gold = [index[ex.label] for ex in examples]
        pred = [int(p.argmax()) for p in probs]
        report = classification_report(gold, pred, names)
    else:
        words = tasks.word_predictions(features, [p.argmax(-1).tolist() for p in probs], len(examples))
        gold = [index[t] for ex in examples for t in ex.tags]
        pred = [p for sent in words for p in sent]
        report = classification_report(gold, pred, names)
        report["token_accuracy"] = report["accuracy"]
        if is_bio(names):
            report.update(chunk_f1([ex.tags for ex in examples], [[names[p] for p in s] for s in words]))
    if png is not None:
        from lmforge.viz.confusion import plot_confusion

        plot_confusion(report["confusion"], names, png, title=f"{task}: accuracy {report['accuracy']:.3f}")
    return report


def predict_lines(model: nn.Module, tokenizer, info: dict[str, Any], lines: list[str]) -> list[dict[str, Any]]:
    """One result per line. seq-cls: ``text`` or ``text<TAB>pair`` -> label and probabilities;
    token-cls: whitespace-separated words -> one label (and its probability) per word."""
    names, task = info["labels"], info["task"]
    max_len = min(int(info.get("max_len") or 512), model.config.max_positions)
    real = [i for i, line in enumerate(lines) if line.strip()]
    results: list[dict[str, Any]] = [{"label": None, "probabilities": {}} if task == "seq-cls"
                                     else {"words": [], "labels": [], "probabilities": []} for _ in lines]
    if task == "seq-cls":
        examples = [tasks.Example(f"line {i + 1}", *[*lines[i].split("\t", 1), None][:2]) for i in real]
    else:
        examples = [tasks.Example(f"line {i + 1}", words=lines[i].split()) for i in real]
    features = encode(task, examples, tokenizer, names, max_len)
    probs = probabilities(model, features, tokenizer.pad_id)
    if task == "seq-cls":
        for i, p in zip(real, probs, strict=True):
            results[i] = {"label": names[int(p.argmax())],
                          "probabilities": {n: round(float(v), 6) for n, v in zip(names, p, strict=True)}}
        return results
    words = tasks.word_predictions(features, [p.argmax(-1).tolist() for p in probs], len(examples))
    best = tasks.word_predictions(features, [p.max(-1).values.tolist() for p in probs], len(examples))
    for k, i in enumerate(real):
        results[i] = {"words": examples[k].words, "labels": [names[p] for p in words[k]],
                      "probabilities": [round(float(v), 6) for v in best[k]]}
    return results
