"""``lmforge finetune``, ``lmforge evaluate`` and ``lmforge predict``: over ``lmforge.workflows.finetune``.

    lmforge finetune --model DIR --task seq-cls --train train.csv --eval dev.csv --strategy lora --out runs/cls
    lmforge evaluate --model runs/cls --data test.csv                 # metrics as one JSON object
    echo "It may be a virus." | lmforge predict --model runs/cls      # {"label": ..., "probabilities": {...}}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lmforge.cli.common import (
    add_common,
    add_input_errors,
    add_training_flags,
    apply_runtime,
    fraction,
    input_lines,
    non_negative_float,
    positive_float,
    positive_int,
    probability,
)
from lmforge.errors import LmforgeError


def run_finetune(args) -> int:
    from lmforge.train.config import TrainConfig, load_recipe
    from lmforge.train.scores import format_report
    from lmforge.workflows.finetune import FinetuneArgs, finetune

    apply_runtime(args)
    if args.overrides and not args.config:
        raise LmforgeError(f"{args.overrides[0]}: KEY=VALUE overrides need --config RECIPE.yaml")
    recipe = load_recipe(args.config, args.overrides, {"train": TrainConfig, "finetune": FinetuneArgs}) \
        if args.config else {}
    flags = {k: v for k, v in vars(args).items() if k in FinetuneArgs.__dataclass_fields__}
    flags["lora_targets"] = [t for t in args.lora_targets.split(",") if t] if args.lora_targets else None
    finetune_args = FinetuneArgs.from_recipe(recipe, flags)
    if args.print_config:
        import dataclasses

        import yaml

        print(yaml.safe_dump({"finetune": dataclasses.asdict(finetune_args)}, sort_keys=False), end="")
        return 0
    report = finetune(finetune_args)
    metrics = report.get("eval") or {}
    if metrics:
        print(format_report(metrics), file=sys.stderr)
    summary = {k: v for k, v in report.items() if k != "eval"}
    summary["eval"] = {k: v for k, v in metrics.items() if k not in ("per_class", "confusion")}
    print(json.dumps({"out": finetune_args.out, **summary}))
    return 0


def run_evaluate(args) -> int:
    from lmforge import load
    from lmforge.data.tasks import read_task
    from lmforge.interop.directories import finetuned_info
    from lmforge.models.interfaces import generates_text
    from lmforge.train.scores import format_report
    from lmforge.workflows.finetune import evaluate_model

    apply_runtime(args)
    model, tok = load(args.model, device=args.device)
    if generates_text(model) and "Classification" not in type(model).__name__:  # a language model: perplexity
        from lmforge.files import read_text_utf8
        from lmforge.workflows.perplexity import perplexity

        if tok is None:
            raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
        report = perplexity(model, tok, read_text_utf8(args.data, "text file"), stride=args.stride,
                            batch_size=args.batch_size)
        print(f"perplexity {report['perplexity']:.3f} per token, {report['bits_per_character']:.4f} bits per "
              f"character over {report['characters']:,} characters", file=sys.stderr)
        print(json.dumps({"model": args.model, "data": args.data, **report}))
        return 0
    if tok is None:
        raise LmforgeError(f"{args.model}: no tokenizer (tokenizer.json or vocab.txt)")
    info = finetuned_info(args.model, model)  # the model is loaded once, whichever kind it is
    examples = read_task(info["task"], args.data)
    max_len = min(int(info.get("max_len") or 512), model.config.max_positions)
    report = evaluate_model(model, tok, info["task"], info["labels"], examples, max_len, args.batch_size,
                            Path(args.png) if args.png else None)
    print(format_report(report), file=sys.stderr)
    print(json.dumps(report))
    return 0


def run_predict(args) -> int:
    from lmforge.workflows.finetune import load_finetuned, predict_lines

    apply_runtime(args)
    model, tok, info = load_finetuned(args.model, args.device)
    if not args.text and sys.stdin.isatty():
        print("lmforge predict: reading lines from standard input (Ctrl-D ends)", file=sys.stderr)
    lines = list(input_lines(args.text, errors=args.errors))
    chunk = 256  # stream results for long inputs
    for start in range(0, len(lines), chunk):
        for result in predict_lines(model, tok, info, lines[start: start + chunk]):
            print(json.dumps(result, ensure_ascii=False))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune an encoder on a labeled task (full | frozen | lora | adapter)",
                       description="Fine-tune an lmforge or Hugging Face BERT directory. Prints one JSON summary; "
                                   "writes the model, finetune.json and confusion.png into --out. Settings come "
                                   "from --config RECIPE.yaml (its finetune: section holds any field of "
                                   "FinetuneArgs), then KEY=VALUE overrides (finetune.lr=3e-4), then the flags. "
                                   "The run checkpoints into OUT/run every --save-every steps and on Ctrl-C or "
                                   "SIGTERM; the same command again resumes it from there.")
    p.add_argument("--config", metavar="YAML", help="a recipe whose finetune: section holds the settings")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. finetune.warmup=0.06")
    p.add_argument("--model", help="starting model directory (lmforge encoder or biLM, or HF BERT)")
    p.add_argument("--task", help="seq-cls | token-cls")
    p.add_argument("--train", help="CSV / TSV / JSONL (seq-cls) or word/TAG / CoNLL (token-cls)")
    p.add_argument("--eval", help="evaluation file in the same format")
    p.add_argument("--strategy", help="full (default) | frozen | lora | adapter")
    p.add_argument("--out", help="output directory (default runs/finetune)")
    p.add_argument("--epochs", type=positive_float, help="passes over the training set (default 2)")
    p.add_argument("--max-steps", type=positive_int, help="optimizer steps (overrides --epochs)")
    p.add_argument("--batch-size", type=positive_int)
    p.add_argument("--lr", type=positive_float,
                   help="peak learning rate (default: full 5e-5, frozen 1e-3, lora/adapter 5e-4)")
    p.add_argument("--max-len", type=positive_int,
                   help="sub-word tokens per input, special tokens included (default 128)")
    p.add_argument("--seed", type=int)
    p.add_argument("--mix", action="store_true", help="frozen: the head reads a learned scalar mix of all layers")
    p.add_argument("--lora-r", type=positive_int)
    p.add_argument("--lora-alpha", type=positive_float)
    p.add_argument("--lora-dropout", type=fraction)
    p.add_argument("--lora-targets", help="comma-separated module patterns (default '*.in_proj,*.out_proj')")
    p.add_argument("--adapter-size", type=positive_int, help="adapter bottleneck width (default 64)")
    p.add_argument("--merge", action="store_true", help="lora: merge into the weights, save a full model")
    p.add_argument("--label-all", action="store_true", help="token-cls: label every sub-token, not just the first")
    p.add_argument("--limit", type=positive_int, help="use only the first N training examples")
    p.add_argument("--scratch", action="store_true", help="re-initialise the encoder (no pretraining; a baseline)")
    p.add_argument("--arch", help="transformer (default) | cnn: train a fresh sentence CNN (seed 001 problem 3) "
                   "with --model's tokenizer (seq-cls, full)")
    p.add_argument("--weight-decay", type=non_negative_float, help="AdamW weight decay (default 0.01)")
    p.add_argument("--warmup", type=fraction, help="share of the steps spent warming up (default 0.1)")
    p.add_argument("--eval-batch-size", type=positive_int, help="rows per evaluation batch (default 64)")
    p.add_argument("--eval-every", type=positive_int, metavar="N",
                   help="score the model on --eval every N steps and keep the best weights (the report says "
                   "which step)")
    p.add_argument("--best-metric", choices=["accuracy", "macro_f1", "chunk_f1"],
                   help="what 'best' means with --eval-every (default accuracy)")
    p.add_argument("--early-stopping", type=positive_int, metavar="PATIENCE",
                   help="with --eval-every: stop after PATIENCE evaluations without improvement")
    add_training_flags(p, "finetune")
    p.add_argument("--unlabeled", metavar="FILE", help="self-training: texts to pseudo-label, one a line (or "
                   "CSV / JSONL; true labels, if present, only score the pseudo-labels)")
    p.add_argument("--self-train-rounds", type=positive_int,
                   help="rounds of pseudo-labeling and re-training (default 1)")
    p.add_argument("--confidence", type=probability,
                   help="keep a pseudo-label when its top probability >= C (default 0.9)")
    p.add_argument("--pseudo-ratio", type=positive_float, help="at most this many pseudo-labels per labeled "
                   "example, split over the classes as the labeled set is (default 1)")
    add_common(p, device="auto")
    # None = not given: the recipe's value, else FinetuneArgs' default, applies
    p.set_defaults(device=None, mix=None, merge=None, label_all=None, scratch=None)
    p.add_argument("--no-progress", dest="progress", action="store_false", default=None)
    p.add_argument("--keep-checkpoints", action="store_true", default=None)
    p.add_argument("--save-every", type=int, help="checkpoint every N steps (default 100; 0: only at the end)")
    p.add_argument("--overwrite", action="store_true", default=None,
                   help="replace another fine-tuning output (another strategy) already in --out")
    p.set_defaults(handler=run_finetune)

    e = sub.add_parser("evaluate", help="metrics of a classifier on a labeled file, or a language model's "
                                        "perplexity on a text file (JSON)",
                       description="A classifier: accuracy, macro-F1, per-class report and confusion matrix (token "
                                   "accuracy and BIO chunk F1 for tagging). A language model (GPT): perplexity, "
                                   "bits per character and per byte of a text file, scored in sliding windows. "
                                   "One JSON object on standard output.")
    e.add_argument("--model", required=True, help="a fine-tuned classifier, or a language model directory")
    e.add_argument("--data", required=True, help="labeled file in the training format, or a text file (LM)")
    e.add_argument("--stride", type=positive_int, metavar="N",
                   help="LM: tokens each window moves on (default half the context)")
    e.add_argument("--batch-size", type=positive_int, default=64)
    e.add_argument("--png", help="also write the confusion matrix to this PNG")
    add_common(e, device="cpu")
    e.set_defaults(handler=run_evaluate)

    r = sub.add_parser("predict", help="labels for texts: one JSON object per input line",
                       description="seq-cls: each line is a text (or text<TAB>pair) -> label and probabilities. "
                                   "token-cls: each line is whitespace-separated words -> a label per word.")
    r.add_argument("--model", required=True)
    add_input_errors(r)
    add_common(r, device="cpu")
    r.add_argument("text", nargs="*", metavar="TEXT", help="texts (default: lines of standard input)")
    r.set_defaults(handler=run_predict)
