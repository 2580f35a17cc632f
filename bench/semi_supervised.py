"""Few labels, many unlabeled texts: what continued pretraining and self-training buy, measured.

The course's question (10,000 labeled + 2,000,000 unlabeled tweets) on data installable here: WordNet 3.0
glosses (Debian ``wordnet-base``, 117,659 synsets) labeled with their 45 lexicographer-file supersenses
(``noun.animal``, ``verb.motion``, ...). One fixed test set, one unlabeled pool, and per label budget and seed
a labeled sample (every supersense at least once, the rest drawn at random). Rows, per budget:

    minilm            all-MiniLM-L6-v2 -> fine-tune
    minilm+st         ... + self-training (1 round: pseudo-label the pool, re-train from MiniLM)
    dapt              MiniLM -> continued MLM pretraining on the unlabeled glosses -> fine-tune
    dapt+st           ... + self-training
    scratch           a small BERT pretrained from scratch on the unlabeled glosses only -> fine-tune

    python bench/semi_supervised.py                   # the scaled-down run of docs/finetuning.md (~75 min here)
    python bench/semi_supervised.py --budgets 2000 10000 --unlabeled 100000 --pool 100000 --test 5000 \\
        --dapt-steps 2000 --seq-len 128 --dapt-lr 5e-5 --max-len 64 --strategy lora --lr 5e-4 \\
        --confidence 0.9 --pseudo-ratio 1 --scratch-steps 2000 --out runs/semi-full   # the full design (GPU advised)

Every run goes through the public workflows (``pretrain``, ``finetune``); each run's directory under
``--out`` keeps its finetune.json, and a run already finished is not repeated. The table (markdown) and
``results.json`` land in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import time
from pathlib import Path

import torch

from lmforge.data.sources import minilm_path, wordnet_glosses
from lmforge.workflows.finetune import FinetuneArgs, finetune
from lmforge.workflows.pretrain import pretrain

ROWS = ("minilm", "minilm+st", "dapt", "dapt+st", "scratch")


# -- data ---------------------------------------------------------------------------------------------------
def write_csv(path: Path, rows: list[tuple[str, str]]) -> None:
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["label", "text"])
        w.writerows([label, text] for text, label in rows)


def labeled_sample(pool: list[tuple[str, str]], budget: int, seed: int) -> list[tuple[str, str]]:
    """``budget`` glosses: the first of each supersense in a seeded shuffle, then the next ones at random."""
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    first: dict[str, int] = {}
    for i in order:
        first.setdefault(pool[i][1], i)
    chosen = sorted(first.values(), key=order.index)
    taken = set(chosen)
    chosen += [i for i in order if i not in taken][: budget - len(chosen)]
    return [pool[i] for i in chosen]


def prepare(args: argparse.Namespace, out: Path) -> dict[str, Path]:
    """test.csv, pool.csv (unlabeled texts with their true labels, to score pseudo-labels), unlabeled.txt
    (the pretraining text) and one train CSV per budget and seed."""
    glosses = wordnet_glosses()
    random.Random(0).shuffle(glosses)
    test, rest = glosses[: args.test], glosses[args.test:]
    unlabeled, labeled_pool = rest[: args.unlabeled], rest[args.unlabeled:]
    files = {"test": out / "test.csv", "pool": out / "pool.csv", "text": out / "unlabeled.txt"}
    write_csv(files["test"], test)
    write_csv(files["pool"], unlabeled[: args.pool])
    files["text"].write_text("\n".join(text for text, _ in unlabeled) + "\n", encoding="utf-8")
    for budget in args.budgets:
        for seed in args.seeds:
            files[f"train-{budget}-{seed}"] = out / f"train-{budget}-{seed}.csv"
            write_csv(files[f"train-{budget}-{seed}"], labeled_sample(labeled_pool, budget, seed))
    return files


# -- stages -------------------------------------------------------------------------------------------------
def timed_pretrain(recipe: dict, run: Path) -> tuple[Path, float]:
    """(model directory, wall seconds); a finished run is not repeated and keeps its first time."""
    clock = run / "wall_s.json"
    if not (run / "model" / "config.json").is_file():
        start = time.perf_counter()
        pretrain(recipe, run)
        clock.write_text(json.dumps(round(time.perf_counter() - start, 1)))
    return run / "model", json.loads(clock.read_text())


def dapt_recipe(args: argparse.Namespace, text: Path) -> dict:
    """configs/bert-dapt.yaml's settings, scaled to the budget: MLM only, 15% (80/10/10), warmup, small lr."""
    return {"model": {"init_from": str(minilm_path())},
            "data": {"objective": "mlm", "files": [str(text)], "seq_len": args.seq_len, "val_fraction": 0.02,
                     "eval_batches": 4},
            "train": {"lr": args.dapt_lr, "min_lr": 0.0, "warmup_steps": max(1, args.dapt_steps // 10),
                      "max_steps": args.dapt_steps, "schedule": "linear", "batch_size": 32, "weight_decay": 0.01,
                      "betas": [0.9, 0.98], "eval_every": args.dapt_steps, "save_every": args.dapt_steps,
                      "log_every": max(1, args.dapt_steps // 10), "progress": False, "seed": 0}}


def scratch_recipe(args: argparse.Namespace, text: Path) -> dict:
    """The old answer: a small BERT (WordPiece trained on the same glosses) pretrained from scratch."""
    return {"tokenizer": {"kind": "wordpiece", "vocab_size": 4096},
            "data": {"objective": "mlm", "files": [str(text)], "seq_len": args.seq_len, "val_fraction": 0.02,
                     "eval_batches": 4},
            "model": {"preset": "bert-tiny", "d_model": 128, "n_layers": 2, "n_heads": 4, "d_ff": 512,
                      "max_positions": 128},
            "train": {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": max(1, args.scratch_steps // 10),
                      "max_steps": args.scratch_steps,
                      "schedule": "linear", "batch_size": 32, "weight_decay": 0.01, "eval_every": args.scratch_steps,
                      "save_every": args.scratch_steps, "log_every": 50, "progress": False, "seed": 0}}


def run_finetune(args: argparse.Namespace, model: Path, train: Path, test: Path, out: Path, seed: int,
                 pool: Path | None = None, scratch_model: bool = False) -> dict:
    done = out / "finetune.json"
    if done.is_file():
        return json.loads(done.read_text())
    strategy = "full" if scratch_model else args.strategy
    lr = args.scratch_lr if scratch_model else args.lr
    fa = FinetuneArgs(model=str(model), task="seq-cls", train=str(train), eval=str(test), out=str(out),
                      strategy=strategy, mix=strategy == "frozen" and not scratch_model, lr=lr, epochs=args.epochs,
                      batch_size=args.batch_size, max_len=args.max_len, seed=seed, progress=False,
                      unlabeled=str(pool) if pool else None, confidence=args.confidence,
                      pseudo_ratio=args.pseudo_ratio, self_train_rounds=1)
    return finetune(fa)


# -- the table ----------------------------------------------------------------------------------------------
def mean_std(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{100 * statistics.mean(values):.1f} ± {100 * sd:.1f}"


def table(results: list[dict], times: dict[str, float]) -> str:
    lines = ["| labeled | method | accuracy % | macro-F1 % | pseudo-labels (accuracy %) | fine-tune s | "
             "self-training s |", "| ---: | --- | --- | --- | --- | ---: | ---: |"]
    for budget in sorted({r["budget"] for r in results}):
        for row in ROWS:
            runs = [r for r in results if r["budget"] == budget and r["row"] == row]
            if not runs:
                continue
            pseudo = "–"
            if runs[0]["pseudo_labels"] is not None:
                pseudo = (f"{statistics.mean(r['pseudo_labels'] for r in runs):.0f} "
                          f"({100 * statistics.mean(r['pseudo_accuracy'] or 0 for r in runs):.1f})")
            st = f"{statistics.mean(r['self_train_s'] for r in runs):.0f}" if row.endswith("+st") else "–"
            lines.append(f"| {budget} | {row} | {mean_std([r['accuracy'] for r in runs])} | "
                         f"{mean_std([r['macro_f1'] for r in runs])} | {pseudo} | "
                         f"{statistics.mean(r['finetune_s'] for r in runs):.0f} | {st} |")
    lines.append("")
    lines.append(" ".join(f"{k}: {v:.0f} s." for k, v in times.items()))
    return "\n".join(lines)


def summarize(row: str, budget: int, seed: int, report: dict) -> list[dict]:
    """One result per row: a self-training run gives its round 0 (the plain row) and its last round."""
    st = report.get("self_training")
    first = st["rounds"][0] if st else {"eval": report["eval"], "train_time_s": report["train_time_s"]}
    base = row.removesuffix("+st")
    out = [{"row": base, "budget": budget, "seed": seed, "accuracy": first["eval"]["accuracy"],
            "macro_f1": first["eval"]["macro_f1"], "pseudo_labels": None, "pseudo_accuracy": None,
            "finetune_s": first["train_time_s"], "self_train_s": 0.0}]
    if st:
        last = st["rounds"][-1]
        out.append({"row": row, "budget": budget, "seed": seed, "accuracy": last["eval"]["accuracy"],
                    "macro_f1": last["eval"]["macro_f1"], "pseudo_labels": last["pseudo_labels"],
                    "pseudo_accuracy": last["pseudo_accuracy"], "finetune_s": first["train_time_s"],
                    "self_train_s": last["predict_time_s"] + last["train_time_s"]})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="runs/semi", type=Path)
    p.add_argument("--budgets", type=int, nargs="+", default=[150, 400])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--test", type=int, default=300, help="fixed test glosses")
    p.add_argument("--unlabeled", type=int, default=20000, help="unlabeled glosses: the pretraining text")
    p.add_argument("--pool", type=int, default=500, help="of those, the ones self-training pseudo-labels")
    p.add_argument("--strategy", default="frozen", help="MiniLM fine-tuning: frozen (+ scalar mix) | lora | full")
    p.add_argument("--lr", type=float, default=1.5e-2, help="MiniLM fine-tuning (frozen: the head)")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-len", type=int, default=24)
    p.add_argument("--confidence", type=float, default=0.5)
    p.add_argument("--pseudo-ratio", type=float, default=0.5)
    p.add_argument("--seq-len", type=int, default=48, help="pretraining sequence length")
    p.add_argument("--dapt-steps", type=int, default=50)
    p.add_argument("--dapt-lr", type=float, default=1e-4)
    p.add_argument("--scratch-steps", type=int, default=150)
    p.add_argument("--scratch-lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    files = prepare(args, out)
    times = {"data": time.perf_counter() - start}
    models = {"minilm": minilm_path()}
    models["dapt"], times["continued pretraining (once)"] = timed_pretrain(dapt_recipe(args, files["text"]),
                                                                             out / "dapt")
    models["scratch"], times["pretraining from scratch (once)"] = timed_pretrain(
        scratch_recipe(args, files["text"]), out / "scratch")
    results: list[dict] = []
    for budget in args.budgets:
        for seed in args.seeds:
            train = files[f"train-{budget}-{seed}"]
            for row in ("minilm+st", "dapt+st", "scratch"):
                base = row.removesuffix("+st")
                report = run_finetune(args, models[base], train, files["test"], out / f"{row}-{budget}-{seed}",
                                      seed, files["pool"] if row.endswith("+st") else None, base == "scratch")
                results += summarize(row, budget, seed, report)
                (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
                print(json.dumps(results[-1]), flush=True)
    times["total"] = time.perf_counter() - start
    text = table(results, times)
    (out / "table.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
