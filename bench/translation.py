"""Transformer vs RNN seq2seq with attention on the Bible en→es pairs: BLEU, chrF, time per epoch, alignments.

    lmforge pretrain --config configs/seq2seq-mini.yaml     --out runs/seq2seq-mini
    lmforge pretrain --config configs/rnn-seq2seq-mini.yaml --out runs/rnn-seq2seq-mini
    .venv/bin/python bench/translation.py runs/seq2seq-mini runs/rnn-seq2seq-mini --threads 1

Both recipes see the same pairs in the same order (the same data seed, batch size and number of steps), so
the training budget is equal in examples; this script measures what that budget costs each of them:

    step time     forward + backward + AdamW on the run's own batches, in train mode, timed in alternating
                  rounds (Transformer, RNN, Transformer, ...) with the process CPU clock, which a busy
                  machine disturbs far less than the wall clock; the best round of each is kept
    time / epoch  step time x (training pairs / batch size)
    BLEU, chrF    sacrebleu on the held-out books (Ruth, Jonah, Philippians, James), beam search (4 beams)
                  and greedy, with the decoding time

It also writes the two loss curves on one plot and the cross-attention of both models on one test verse.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import lmforge
from lmforge.data import sources
from lmforge.models import count_parameters
from lmforge.schema import load_recipe
from lmforge.train.optim import build_optimizer
from lmforge.viz.plots import plot_loss_curves
from lmforge.workflows.pretrain import build_source, expand_files
from lmforge.workflows.pretrain_args import PRETRAIN
from lmforge.workflows.translate import alignment, evaluate_translation, plot_alignment


def training_setup(run: Path):
    """A freshly initialised copy of the run's model, its optimizer and its batch source."""
    recipe = load_recipe(PRETRAIN, run / "config.yaml")
    data, config = recipe["data"], recipe["train"]
    model, tokenizer = lmforge.load(run / "model")
    for p in model.parameters():  # new weights: the step cost does not depend on them
        torch.nn.init.normal_(p, std=0.02) if p.dim() > 1 else torch.nn.init.zeros_(p)
    source = build_source(data, tokenizer, run, expand_files(data.files), config.batch_size, config.seed)
    return model.train(), build_optimizer(model, config, torch.device("cpu")), source, config


def step_seconds(setups: dict[str, tuple], rounds: int, steps: int) -> dict[str, float]:
    """Best-of-``rounds`` CPU seconds per training step, the models taking turns."""
    times: dict[str, list[float]] = {name: [] for name in setups}
    for r in range(rounds + 1):  # round 0 warms up
        for name, (model, optimizer, source, _) in setups.items():
            batches = [source.batch(r * steps + i) for i in range(steps)]
            start = time.process_time()
            for batch in batches:
                model(**batch).loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if r:
                times[name].append((time.process_time() - start) / steps)
    return {name: min(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("transformer", type=Path, help="run directory of configs/seq2seq-mini.yaml")
    parser.add_argument("rnn", type=Path, help="run directory of configs/rnn-seq2seq-mini.yaml")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="training steps per timed round")
    parser.add_argument("--limit", type=int, default=None, help="score the first N test pairs only")
    parser.add_argument("--img", type=Path, default=Path("docs/img"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    runs = {"Transformer": args.transformer, "RNN + attention": args.rnn}

    setups = {name: training_setup(run) for name, run in runs.items()}
    seconds = step_seconds(setups, args.rounds, args.steps)
    test = sources.bible_pairs()["test"]
    rows, trained = {}, {}
    for name, run in runs.items():
        model, tokenizer = trained[name] = lmforge.load(run / "model")
        _, _, source, config = setups[name]
        pairs = len(source.shard.lines) - 1
        evals = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        last_eval = [e for e in evals if e.get("event") == "eval"][-1]
        beam = evaluate_translation(model, tokenizer, test, beams=4, limit=args.limit, progress=False)
        greedy = evaluate_translation(model, tokenizer, test, beams=1, limit=args.limit, progress=False)
        rows[name] = {
            "parameters": count_parameters(model, by_component=False), "steps": config.max_steps,
            "batch": config.batch_size, "train_pairs": pairs, "epochs": round(config.max_steps * config.batch_size
                                                                               / pairs, 2),
            "step_cpu_s": round(seconds[name], 4),
            "epoch_cpu_min": round(seconds[name] * pairs / config.batch_size / 60, 2),
            "eval_loss": round(last_eval["eval_loss"], 3), "bleu": beam["bleu"], "chrf": beam["chrf"],
            "bleu_greedy": greedy["bleu"], "decode_s_beam4": beam["seconds"], "decode_s_greedy": greedy["seconds"],
            "sample": beam["hypotheses"][:3],
        }
        print(json.dumps({name: rows[name]}, ensure_ascii=False), file=sys.stderr)

    verse_en, verse_es = alignment_verse(test)
    maps = [(name, alignment(model, tokenizer, verse_en, verse_es)) for name, (model, tokenizer) in trained.items()]
    plot_alignment(maps, args.img / "translation_alignment.png")
    plot_loss_curves(list(runs.values()), args.img / "translation_loss.png", labels=list(runs), smoothing=0.6)

    t, r = rows["Transformer"], rows["RNN + attention"]
    print("| model | parameters | steps × batch | epochs | eval loss | BLEU (beam 4) | chrF | BLEU greedy "
          "| CPU s / step | CPU min / epoch |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, row in rows.items():
        print(f"| {name} | {row['parameters']:,} | {row['steps']} × {row['batch']} | {row['epochs']} "
              f"| {row['eval_loss']} | {row['bleu']} | {row['chrf']} | {row['bleu_greedy']} "
              f"| {row['step_cpu_s']} | {row['epoch_cpu_min']} |")
    print(f"\nRNN / Transformer time per step: {r['step_cpu_s'] / t['step_cpu_s']:.2f}x; "
          f"BLEU difference (Transformer - RNN): {t['bleu'] - r['bleu']:+.2f}")
    print(json.dumps({"threads": args.threads, "rows": rows}, ensure_ascii=False))


def alignment_verse(path: Path) -> tuple[str, str]:
    """A short verse of the test books for the alignment picture (the shortest of 10 to 25 words)."""
    from lmforge.workflows.translate import read_pairs

    pairs = [p for p in read_pairs(path) if 10 <= len(p[0].split()) <= 25]
    return min(pairs, key=lambda p: (len(p[0]), p[0])) if pairs else read_pairs(path)[0]


if __name__ == "__main__":
    main()
