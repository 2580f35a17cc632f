"""The step-time cost of serving LoRA adapters beside a base (generation/adapters.py), on SmolLM2-135M's shape.

    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/adapters.py --rows 4 16

Two engines on the same random weights (SmolLM2-135M's shape), the CPU runner's lean step: the base alone, and
the base with two LoRA adapters installed (``--rank`` on the attention's in_proj and out_proj, the default targets
of ``finetune --strategy lora``; the second adapter twice the rank), whose rows take base, adapter 1, adapter 2 in
turn. Each engine holds ``rows`` requests (prompt 30 tokens) that decode side by side; rounds of ``--steps`` steps
alternate between the two, so that both read caches of the same lengths. Rows are printed and appended to
bench/results/adapters.jsonl.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).parent / "results" / "adapters.jsonl"


def with_adapters(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """A copy of ``model`` with two random LoRA adapters (ranks ``rank`` and 2 ``rank``) over its attention."""
    from lmforge.generation.adapters import LoRAFactors, install_adapters

    served = copy.deepcopy(model)
    g = torch.Generator().manual_seed(1)
    adapters = []
    for k, r in enumerate((rank, 2 * rank), start=1):
        layers = {}
        for name, m in model.named_modules():
            if name.endswith(("self_attn.in_proj", "self_attn.out_proj")):
                layers[name] = (torch.randn(r, m.in_features, generator=g) * 0.02,
                                torch.randn(m.out_features, r, generator=g) * 0.02)
        adapters.append(LoRAFactors(f"adapter{k}", 16.0 / r, layers))
    install_adapters(served, adapters)
    return served


def engine(model: torch.nn.Module, rows: int, adapters: bool):
    """An engine of ``rows`` slots holding ``rows`` requests (adapters 0, 1, 2 in turn when ``adapters``)."""
    from lmforge.generation.engine import Engine, Request

    e = Engine(model, slots=rows, capacity=1024)
    g = torch.Generator().manual_seed(0)
    for i in range(rows):
        ids = torch.randint(10, model.config.vocab_size, (30,), generator=g).tolist()
        e.submit(Request(ids, max_new_tokens=900, stop_ids=[], adapter=i % 3 if adapters else 0))
    e.step()  # the prefills
    return e


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[4, 16])
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--steps", type=int, default=20, help="steps a round")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from llama_pair import lmforge_model

    base, what = lmforge_model(None)
    served = with_adapters(base, args.rank)
    for rows in args.rows:
        engines = {"base": engine(base, rows, False), "2 adapters": engine(served, rows, True)}
        times: dict[str, list[float]] = {name: [] for name in engines}
        for _ in range(args.rounds):
            for name, e in engines.items():
                began = time.perf_counter()
                for _ in range(args.steps):
                    e.step()
                times[name].append((time.perf_counter() - began) / args.steps * 1000)
        ms = {name: round(statistics.median(t), 2) for name, t in times.items()}
        row = {"model": what, "rows": rows, "rank": args.rank, "threads": torch.get_num_threads(),
               "runner": engines["base"].runner.name, "ms_per_step": ms,
               "cost": round(ms["2 adapters"] / ms["base"] - 1, 3)}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        with RESULTS.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
