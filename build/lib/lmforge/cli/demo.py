"""``lmforge demo``: the main job on the embedded default (Shakespeare); see ``lmforge.workflows.demo``."""

from __future__ import annotations

import argparse

from lmforge.cli.common import add_common, non_negative_int, positive_int


def run_demo(args: argparse.Namespace) -> int:
    from lmforge.workflows.demo import run_demo as demo

    if args.quick:  # a minute instead of six: fewer steps, no exercises
        args.steps, args.finetune_steps, args.skip_examples = min(args.steps, 150), min(args.finetune_steps, 20), True
    demo(args.out, steps=args.steps, finetune_steps=args.finetune_steps, max_new_tokens=args.max_new_tokens,
         seed=args.seed, skip_examples=args.skip_examples)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="the main job on the embedded default (Shakespeare)",
                       description="Exercises, a tokenizer, a small GPT pretrained on Shakespeare, generated text and "
                       "a LoRA fine-tune of the real all-MiniLM-L6-v2, end to end on a CPU in a few minutes. "
                       "Rerun with the same --out to resume.")
    p.add_argument("--out", default="runs/demo", help="run directory (default runs/demo; rerun to resume)")
    p.add_argument("--steps", type=positive_int, default=1500, help="pretraining steps (default 1500, about 4 minutes)")
    p.add_argument("--max-new-tokens", type=positive_int, default=120)
    p.add_argument("--finetune-steps", type=non_negative_int, default=200,
                   help="LoRA steps on MiniLM (default 200; 0 skips)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-examples", action="store_true", help="go straight to the pipeline")
    p.add_argument("--quick", action="store_true",
                   help="about a minute: 150 pretraining steps, 20 LoRA steps, no exercises")
    add_common(p)
    p.set_defaults(handler=run_demo)
