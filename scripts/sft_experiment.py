"""The instruction-tuning experiment of docs/finetuning.md: SmolLM2-135M-Instruct zero-shot, few-shot, after
LoRA SFT, and after continued causal-LM pretraining on the task's unlabeled text followed by the same SFT, on
three chat tasks (python -m lmforge.data.sources chat NAME). Every arm is a documented command; each result is
appended to OUT/results.jsonl as it finishes (a stopped run keeps what it has; run again to resume).

    python scripts/sft_experiment.py --out runs/sft-experiment                      # this CPU: scaled down
    python scripts/sft_experiment.py --out runs/sft-full --train 2000 --test 300 --epochs 2 --batch-size 16  # GPU
    python3 scripts/sft_experiment.py --device cuda --arms lora-sft full-sft --data chat ...  # only these arms

Scaled to 2 CPU cores (SmolLM2 trains at about 100-150 tokens/s here): --train conversations per task,
--test items, one epoch.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ARMS = ["zero-shot", "k-shot", "lora-sft", "cpt+lora-sft", "full-sft"]
TASKS = {"hedges": ["test.jsonl"], "wordnet-define": ["test.jsonl", "test-mc.jsonl"], "bible-en-es": ["test.jsonl"]}


def lmforge(*args: str) -> list[dict]:
    """Run ``lmforge ARGS``; its JSON lines on standard output."""
    done = subprocess.run([sys.executable, "-m", "lmforge.cli", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"lmforge {' '.join(args)}: {done.stderr.strip()[-800:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def head(src: Path, dst: Path, n: int) -> Path:
    dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:n]), encoding="utf-8")
    return dst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="runs/sft-experiment")
    parser.add_argument("--train", type=int, default=300, help="training conversations per task")
    parser.add_argument("--dev", type=int, default=40)
    parser.add_argument("--test", type=int, default=100, help="test items per task")
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--shots", type=int, default=3)
    parser.add_argument("--cpt-steps", type=int, default=30, help="continued pretraining steps (0: no such arm)")
    parser.add_argument("--tasks", nargs="*", default=list(TASKS))
    parser.add_argument("--arms", nargs="*", choices=ARMS, default=ARMS[:4],
                        help="which arms to run (full-sft: every weight tuned, at --full-lr)")
    parser.add_argument("--full-lr", type=float, default=5e-5)
    parser.add_argument("--device", default="cpu", help="where evaluate, finetune and pretrain run")
    parser.add_argument("--data", type=Path, help="a folder of task folders already written (default: write "
                                                  "them under OUT/data from the sources)")
    args = parser.parse_args()
    from lmforge.data.sources import smollm2_path, write_chat_task

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done = {(r["task_name"], r["arm"], r["file"]) for r in map(json.loads, results.read_text().splitlines())} \
        if results.is_file() else set()
    base = str(smollm2_path())

    def record(task: str, arm: str, rows: list[dict], extra: dict) -> None:
        with results.open("a") as f:
            for r in rows:
                r.pop("examples", None)
                f.write(json.dumps({"task_name": task, "arm": arm, **r, **extra}) + "\n")
                print(f"{task:15} {arm:12} {r['metric']:12} {r['score']:7} {r['ci95']}", flush=True)

    def evaluate(task: str, arm: str, model: str, files: list[Path], extra: dict, *more: str) -> None:
        todo = [f for f in files if (task, arm, str(f)) not in done]
        if todo:
            record(task, arm, lmforge("evaluate", "--model", model, "--tasks", *map(str, todo), "--limit",
                                      str(args.test), "--batch-size", "16", "--device", args.device, *more),
                   extra)

    for task in args.tasks:
        data = (args.data or out / "data") / task
        if not (data / "test.jsonl").is_file():
            write_chat_task(task, data)
        train = head(data / "train.jsonl", data / f"train-{args.train}.jsonl", args.train)
        dev = head(data / "dev.jsonl", data / f"dev-{args.dev}.jsonl", args.dev)
        tests = [data / name for name in TASKS[task]]
        if "zero-shot" in args.arms:
            evaluate(task, "zero-shot", base, tests, {})
        if "k-shot" in args.arms:
            evaluate(task, f"{args.shots}-shot", base, tests, {}, "--shots", str(args.shots), "--fewshot",
                     str(data / "train.jsonl"))
        arms = [(arm, base) for arm in ("lora-sft", "full-sft") if arm in args.arms]
        if args.cpt_steps and "cpt+lora-sft" in args.arms:
            arms.insert(1, ("cpt+lora-sft", continued(out, task, base, train, args)))
        for arm, start in arms:
            full = arm == "full-sft"
            tuned = out / "models" / f"{task}-{arm}"
            if not (tuned / "finetune.json").is_file():
                began = time.perf_counter()
                lmforge("finetune", "--task", "chat", "--model", start, "--train", str(train), "--eval", str(dev),
                        "--strategy", "full" if full else "lora", "--epochs", str(args.epochs), "--batch-size",
                        str(args.batch_size), "--lr", str(args.full_lr if full else args.lr), "--max-len", "512",
                        "--eval-every", "0", "--out", str(tuned), "--no-progress", "--device", args.device)
                print(f"{task} {arm}: tuned in {time.perf_counter() - began:.0f} s", flush=True)
            report = json.loads((tuned / "finetune.json").read_text())
            evaluate(task, arm, str(tuned), tests, {"train_time_s": report["train_time_s"],
                                                    "tokens_per_s": report["tokens_per_s"],
                                                    "conversations": report["conversations"]})


def continued(out: Path, task: str, base: str, train: Path, args: argparse.Namespace) -> str:
    """SmolLM2 after ``--cpt-steps`` of causal-LM pretraining on the user turns of the training split (the task's
    unlabeled text; no answers): an lmforge directory to start the SFT from."""
    folder = out / "models" / f"{task}-cpt"
    if (folder / "model" / "config.json").is_file():
        return str(folder / "model")
    plain = out / "models" / "smollm2"
    if not (plain / "config.json").is_file():
        lmforge("convert", "--from-gguf", base, "--out", str(plain))
    text = out / "data" / task / "unlabeled.txt"
    lines = [json.loads(line)["messages"][0]["content"].split("\n\n", 1)[-1]
             for line in train.read_text(encoding="utf-8").splitlines()]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    lmforge("pretrain", f"model.init_from={plain}", f"data.files=[{text}]", "data.seq_len=128",
            f"train.max_steps={args.cpt_steps}", "train.batch_size=8", "train.lr=1e-4", "train.eval_every=0",
            f"train.device={args.device}", "--out", str(folder), "--no-progress")
    return str(folder / "model")


if __name__ == "__main__":
    main()
