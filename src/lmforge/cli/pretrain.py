"""``lmforge pretrain``: run (or resume) a YAML recipe; see ``lmforge.workflows.pretrain``.

    lmforge pretrain --config configs/gpt-mini.yaml --out runs/gpt-mini train.max_steps=200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli.common import add_common, add_training_flags, apply_runtime, training_shortcuts


def run_pretrain(args: argparse.Namespace) -> int:
    import yaml

    from lmforge.train.config import TrainConfig, load_recipe
    from lmforge.workflows.pretrain import DataSection, pretrain

    apply_runtime(args)
    schemas = {"train": TrainConfig, "data": DataSection, "tokenizer": dict}  # overrides may add keys there
    recipe = load_recipe(args.config, [*args.overrides, *training_shortcuts(args)], schemas)
    if args.print_config:
        print(yaml.safe_dump(recipe, sort_keys=False), end="")
        return 0
    out = Path(args.out or recipe.get("out") or Path("runs") / Path(args.config).stem)
    if args.quiet:
        recipe["train"]["progress"] = False
    result, model_dir = pretrain(recipe, out)
    print(json.dumps({"out": str(out), "model": str(model_dir), "step": result.step, "loss": result.loss,
                      "eval": result.eval, "resumed_from": result.resumed_from}))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pretrain a model from a YAML recipe (clm | mlm | mlm+nsp | seq2seq | bilm)",
                       description="Pretrain from a recipe. Pointing --out at an existing run resumes it (its "
                                   "data, tokenizer and model sections must be the run's). Ctrl-C or SIGTERM "
                                   "checkpoints the current step before stopping; one run at a time holds --out.")
    p.add_argument("--config", required=True, help="recipe YAML (see configs/)")
    p.add_argument("--out", help="run directory (default: runs/<recipe name>)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="recipe overrides, e.g. train.max_steps=100")
    add_training_flags(p)
    add_common(p, device="auto", device_help="cpu | cuda | cuda:N | auto (default: the recipe's train.device)")
    p.set_defaults(handler=run_pretrain, device=None)
