"""``lmforge pretrain``: run (or resume) a YAML recipe; see ``lmforge.workflows.pretrain``.

    lmforge pretrain --config gpt-mini --out runs/gpt-mini --max-steps 200
    lmforge pretrain --config gpt-mini model.norm=rmsnorm model.positions=rotary train.lr=1e-3

Every key of the recipe (tokenizer:, data:, model:, train:) is a KEY=VALUE argument; the train: keys are also
flags (``--lr``, ``--max-steps``, ``--precision``, ...). ``--print-config`` prints the resolved recipe.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime
from lmforge.workflows.pretrain_args import PRETRAIN

SETTINGS = Settings(Recipe({**PRETRAIN.sections, "runtime": Runtime}, PRETRAIN.fixed), flags=("train", "runtime"),
                    exclude=("runtime.device",), overrides=True)


def run_pretrain(args: argparse.Namespace) -> int:
    from lmforge.workflows.pretrain import pretrain

    recipe = {k: v for k, v in args.settings.items() if k != "runtime"}
    if args.quiet:
        recipe["train"].progress = False
    out = Path(args.out or Path("runs") / Path(args.config or "pretrain").stem)
    result, model_dir = pretrain(recipe, out)
    print(json.dumps({"out": str(out), "model": str(model_dir), "step": result.step, "loss": result.loss,
                      "eval": result.eval, "resumed_from": result.resumed_from}))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pretrain", help="pretrain a model from a YAML recipe (clm | mlm | mlm+nsp | seq2seq | bilm)",
                       description="Pretrain from a recipe (--config FILE or the name of a packaged one: gpt-mini, "
                                   "bert-mini, ...). Pointing --out at an existing run resumes it (its data, "
                                   "tokenizer and model sections must be the run's). Ctrl-C or SIGTERM checkpoints "
                                   "the current step before stopping; one run at a time holds --out.")
    p.add_argument("--out", help="run directory (default: runs/<recipe name>)")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_pretrain)
