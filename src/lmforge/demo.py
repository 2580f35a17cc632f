"""``lmforge demo``: the main job on the embedded default.

For now it runs the seeds' exercises (examples/) that reproduce the course's numbers; as pretraining and
fine-tuning land it grows into the full pipeline on Shakespeare.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

EXAMPLES = [
    "attention_juventus.py",
    "multihead_walkthrough.py",
    "heads_h1_vs_h3.py",
    "merged_query_key.py",
    "positional_encodings.py",
    "lora_ratio.py",
    "cross_modal_search.py",
    "lstm_cell.py",
]


def examples_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "examples"


def run_demo(args: argparse.Namespace) -> int:
    folder = examples_dir()
    for name in EXAMPLES:
        path = folder / name
        print(f"\n=== examples/{name} ===", flush=True)
        start = time.perf_counter()
        runpy.run_path(str(path), run_name="__main__")
        print(f"--- {name} took {time.perf_counter() - start:.2f} s", file=sys.stderr, flush=True)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job on the embedded default (Shakespeare)")
    p.set_defaults(handler=run_demo)
