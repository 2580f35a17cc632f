"""``lmforge demo``: the main job on the embedded default (Shakespeare); see ``lmforge.workflows.demo``."""

from __future__ import annotations

import argparse

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import DemoOptions

SETTINGS = Settings(Recipe({"demo": DemoOptions}), flags=("demo",))


def run_demo(args: argparse.Namespace) -> int:
    from lmforge.workflows.demo import run_demo as demo

    o: DemoOptions = args.settings["demo"]
    steps, finetune_steps, skip_examples = o.steps, o.finetune_steps, o.skip_examples
    if o.quick:  # a minute instead of six: fewer steps, no exercises
        steps, finetune_steps, skip_examples = min(steps, 150), min(finetune_steps, 20), True
    demo(args.out, steps=steps, finetune_steps=finetune_steps, max_new_tokens=o.max_new_tokens, seed=o.seed,
         skip_examples=skip_examples)
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
