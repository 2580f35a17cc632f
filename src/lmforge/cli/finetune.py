"""``lmforge finetune``, ``lmforge evaluate`` and ``lmforge predict``: over ``lmforge.workflows.finetune``.

    lmforge finetune --model DIR --task seq-cls --train train.csv --eval dev.csv --strategy lora --out runs/cls
    lmforge evaluate --model runs/cls --data test.csv                 # metrics as one JSON object
    echo "It may be a virus." | lmforge predict --model runs/cls      # {"label": ..., "probabilities": {...}}
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lmforge.cli.common import Settings, add_quiet, add_settings, input_lines, load_options
from lmforge.errors import LmforgeError
from lmforge.schema import Recipe
from lmforge.workflows.finetune_args import FINETUNE
from lmforge.workflows.options import EvaluateOptions, Runtime, TextInput, Weights


def run_finetune(args) -> int:
    from lmforge.train.scores import format_report
    from lmforge.workflows.finetune import finetune

    finetune_args = args.settings["finetune"]
    report = finetune(finetune_args)
    metrics = report.get("eval") or {}
    if "per_class" in metrics:  # a classifier's table; a chat model reports eval_loss alone
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
    from lmforge.outputs import claim_file
    from lmforge.train.scores import format_report
    from lmforge.workflows.finetune import evaluate_model

    options = args.settings["evaluate"]
    if bool(args.tasks) == bool(args.data):
        raise LmforgeError("evaluate: give --data FILE (a classifier's labels, a language model's text) or "
                           "--tasks FILE.jsonl ... (a chat model's tasks), one of the two")
    if args.png:
        claim_file(args.png, args.overwrite, inputs=[args.data], what="--png")  # before the model is loaded
    model, tok = load(args.model, **load_options(args))
    if args.tasks:
        from lmforge.workflows.chat_eval import evaluate_tasks

        if tok is None:
            raise LmforgeError(f"--model: {args.model} has no tokenizer")
        for path in args.tasks:
            result = evaluate_tasks(model, tok, path, options, args.fewshot)
            print(f"{result['task']}: {result['metric']} {result['score']} (95% CI {result['ci95'][0]}-"
                  f"{result['ci95'][1]}) over {result['items']} items, {options.shots}-shot", file=sys.stderr)
            print(json.dumps(result, ensure_ascii=False), flush=True)
        return 0
    if generates_text(model) and "Classification" not in type(model).__name__:  # a language model: perplexity
        from lmforge.files import read_text_utf8
        from lmforge.workflows.perplexity import perplexity

        if tok is None:
            raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
        report = perplexity(model, tok, read_text_utf8(args.data, "text file"), stride=options.stride,
                            batch_size=options.batch_size)
        print(f"perplexity {report['perplexity']:.3f} per token, {report['bits_per_character']:.4f} bits per "
              f"character over {report['characters']:,} characters", file=sys.stderr)
        print(json.dumps({"model": args.model, "data": args.data, **report}))
        return 0
    if tok is None:
        raise LmforgeError(f"{args.model}: no tokenizer (tokenizer.json or vocab.txt)")
    info = finetuned_info(args.model, model)  # the model is loaded once, whichever kind it is
    examples = read_task(info["task"], args.data)
    max_len = min(int(info.get("max_len") or 512), model.config.max_positions)
    report = evaluate_model(model, tok, info["task"], info["labels"], examples, max_len, options.batch_size,
                            Path(args.png) if args.png else None)
    print(format_report(report), file=sys.stderr)
    print(json.dumps(report))
    return 0


def run_predict(args) -> int:
    from lmforge.workflows.finetune import load_finetuned, predict_lines

    model, tok, info = load_finetuned(args.model, args.settings["runtime"].device)
    if not args.text and sys.stdin.isatty():
        print("lmforge predict: reading lines from standard input (Ctrl-D ends)", file=sys.stderr)
    lines = list(input_lines(args.text, errors=args.settings["input"].errors))
    chunk = 256  # stream results for long inputs
    for start in range(0, len(lines), chunk):
        for result in predict_lines(model, tok, info, lines[start: start + chunk]):
            print(json.dumps(result, ensure_ascii=False))
    return 0


FINETUNE_SETTINGS = Settings(Recipe({**FINETUNE.sections, "runtime": Runtime}, FINETUNE.fixed),
                             flags=("finetune", "runtime"), exclude=("runtime.device",), overrides=True)
EVALUATE_SETTINGS = Settings(Recipe({"evaluate": EvaluateOptions, "runtime": Runtime, "weights": Weights}),
                             flags=("evaluate", "runtime", "weights"))
PREDICT_SETTINGS = Settings(Recipe({"input": TextInput, "runtime": Runtime}), flags=("input", "runtime"))


def add_commands(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune an encoder on a labeled task (full | frozen | lora | adapter)",
                       description="Fine-tune an lmforge or Hugging Face BERT directory. Prints one JSON summary; "
                                   "writes the model, finetune.json and confusion.png into --out. Settings come "
                                   "from --config RECIPE.yaml (its finetune: section), then KEY=VALUE "
                                   "(finetune.lr=3e-4), then the flags. The run checkpoints into OUT/run every "
                                   "--save-every steps and on Ctrl-C or SIGTERM; the same command again resumes it.")
    add_settings(p, FINETUNE_SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_finetune)

    e = sub.add_parser("evaluate", help="metrics of a classifier on a labeled file, or a language model's "
                                        "perplexity on a text file (JSON)",
                       description="A classifier: accuracy, macro-F1, per-class report and confusion matrix (token "
                                   "accuracy and BIO chunk F1 for tagging). A language model (GPT): perplexity, "
                                   "bits per character and per byte of a text file, scored in sliding windows. "
                                   "One JSON object on standard output. A chat model with --tasks: multiple "
                                   "choice by log-likelihood, exact match or chrF/BLEU of greedy replies, each "
                                   "with a 95%% bootstrap interval, one JSON line per tasks file.")
    e.add_argument("--model", required=True, help="a fine-tuned classifier, or a language model directory")
    e.add_argument("--data", help="labeled file in the training format, or a text file (LM)")
    e.add_argument("--tasks", nargs="+", metavar="FILE", help="a chat model's tasks (JSON lines with messages and "
                   "choices+answer, answer, or reference): one JSON line of scores per file")
    e.add_argument("--fewshot", metavar="FILE", help="with --shots K: conversations to take the K examples from")
    e.add_argument("--png", help="also write the confusion matrix to this PNG")
    e.add_argument("--overwrite", action="store_true", help="replace an existing file at --png (without it an "
                   "existing file is refused before any work)")
    add_settings(e, EVALUATE_SETTINGS)
    add_quiet(e)
    e.set_defaults(handler=run_evaluate)

    r = sub.add_parser("predict", help="labels for texts: one JSON object per input line",
                       description="seq-cls: each line is a text (or text<TAB>pair) -> label and probabilities. "
                                   "token-cls: each line is whitespace-separated words -> a label per word.")
    r.add_argument("--model", required=True)
    r.add_argument("text", nargs="*", metavar="TEXT", help="texts (default: lines of standard input)")
    add_settings(r, PREDICT_SETTINGS)
    add_quiet(r)
    r.set_defaults(handler=run_predict)
