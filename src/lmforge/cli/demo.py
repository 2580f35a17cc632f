"""``lmforge demo``: the main job on the embedded default (Shakespeare); see ``lmforge.workflows.demo``."""

from __future__ import annotations

import argparse

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import DemoOptions

SETTINGS = Settings(Recipe({"demo": DemoOptions}), flags=("demo",))


def run_demo(args: argparse.Namespace) -> int:
    from lmforge.workflows.demo import run_demo as demo

    demo(args.out, args.settings["demo"])
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job on the embedded default (Shakespeare)",
                       description="Exercises, a tokenizer, a small GPT pretrained on Shakespeare, generated text and "
                       "a LoRA fine-tune of the real all-MiniLM-L6-v2, end to end on a CPU in a few minutes. "
                       "Rerun with the same --out to resume.")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo; rerun to resume)")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_demo)
