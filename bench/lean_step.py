"""The lean decode step (generation/lean.py) against the step it replaced, on SmolLM2-135M: one process, alternated.

    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/lean_step.py                       # the cached GGUF
    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/lean_step.py --before /tmp/before/src   # + (b)

(a) The CPU engine's step time at 1 and 16 rows, the lean step and the step before it, alternated in one process
    on the same weights: "before" is the same runner with the lean step off, stepping a lone request as one row
    whose products each compute the row twice (the code before the lean step), the model's own forward per step.
    Each engine holds ``rows`` requests (prompt 30 tokens) that decode side by side; rounds of ``--steps`` steps
    alternate between the two, so that both read caches of the same lengths. Also the aten calls of one step.
(b) With ``--before SRC`` (an older checkout's src/): ``lmforge generate`` at batch 1, 128 new tokens, greedy, in
    a process each, alternated: the tokens per second it prints (the prompt's prefill included).

Rows are printed and appended to bench/results/lean_step.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "lean_step.jsonl"
ROOT = Path(__file__).parents[1]
# SmolLM2-Instruct's chat layout written out (``generate --chat`` prints no timing): a reply of 128 tokens
PROMPT = "<|im_start|>user\nWrite a long story about a dragon who learns to cook.<|im_end|>\n<|im_start|>assistant\n"


def record(row: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def engines(model, rows: int) -> dict:
    """Two engines of ``rows`` slots holding ``rows`` requests each: the lean step's and the one before it."""
    from lmforge.generation.engine import Engine, Request

    made = {}
    for name in ("lean", "before"):
        engine = Engine(model, slots=rows, capacity=1024)
        if name == "before":
            engine.runner.lean = None  # the model's forward each step
            if rows == 1:
                engine.runner.row_buckets = [1]  # one row, each product computing it twice (packed_product)
        g = torch.Generator().manual_seed(0)
        for _ in range(rows):
            ids = torch.randint(10, model.config.vocab_size, (30,), generator=g).tolist()
            engine.submit(Request(ids, max_new_tokens=900, stop_ids=[]))
        engine.step()  # the prefills
        made[name] = engine
    return made


def dispatches(engine) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        engine.step()
    return Count.n


def step_times(model, rows: int, rounds: int, steps: int) -> dict:
    """Milliseconds a step, the median over rounds (and their spread), alternating the two engines."""
    pair = engines(model, rows)
    times: dict[str, list[float]] = {name: [] for name in pair}
    calls = {name: dispatches(engine) for name, engine in pair.items()}
    for _ in range(rounds):
        for name, engine in pair.items():
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            times[name].append((time.perf_counter() - start) / steps * 1e3)
    out = {"rows": rows, "rounds": rounds, "steps_per_round": steps}
    for name, t in times.items():
        out[f"{name}_ms"] = round(statistics.median(t), 2)
        out[f"{name}_ms_range"] = [round(min(t), 2), round(max(t), 2)]
        out[f"{name}_dispatches"] = calls[name]
    out["before_over_lean"] = round(out["before_ms"] / out["lean_ms"], 2)
    return out


def cli_rounds(model_path: str, before: str, threads: int, rounds: int) -> dict:
    """``lmforge generate`` tokens/s, now and with ``before``'s sources, alternated process by process."""
    command = [sys.executable, "-m", "lmforge.cli", "generate", "--model", model_path, "--max-new-tokens", "128",
               "--threads", str(threads), "--prompt", PROMPT]
    rates: dict[str, list[float]] = {"lean": [], "before": []}
    for _ in range(rounds):
        for name, src in (("lean", str(ROOT / "src")), ("before", before)):
            run = subprocess.run(command, env={**os.environ, "PYTHONPATH": src}, capture_output=True, text=True,
                                 check=True)
            rates[name].append(float(re.search(r"128 new tokens in [\d.]+ s \(([\d.]+) tokens/s\)", run.stderr)[1]))
    return {"row": "generate_cli", "threads": threads, "rounds": rounds,
            **{f"{k}_tokens_per_s": round(statistics.median(v), 1) for k, v in rates.items()},
            **{f"{k}_tokens_per_s_all": v for k, v in rates.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="SmolLM2 GGUF file or model directory (default: the cached GGUF)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="steps a round")
    p.add_argument("--rows", type=int, nargs="*", default=[1, 16], help="(a)'s row counts (none: (b) only)")
    p.add_argument("--before", help="src/ of an older checkout: (b) lmforge generate, now vs then")
    args = p.parse_args()
    import lmforge
    from lmforge.data.sources import smollm2_path

    path = args.model or str(smollm2_path())
    torch.set_num_threads(args.threads)
    model, _ = lmforge.load(path)
    base = {"bench": "lean_step", "model": Path(path).name, "threads": args.threads, "torch": torch.__version__}
    with torch.inference_mode():
        for rows in args.rows:
            record({**base, "row": "engine_step", **step_times(model, rows, args.rounds, args.steps)})
    if args.before:
        record({**base, **cli_rounds(path, args.before, args.threads, 3)})


if __name__ == "__main__":
    main()
