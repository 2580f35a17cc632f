"""The ``lmforge`` command: a thin layer over the Python API (no logic lives only here).

Each command group lives beside the code it drives, in a module with ``add_commands(subparsers)``;
this file only collects them, runs the chosen handler and turns ``LmforgeError`` into one line on
standard error. Machine-readable output goes to standard output, progress and logs to standard error.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from lmforge import __version__
from lmforge.errors import LmforgeError

# Modules that contribute sub-commands, in the order `lmforge --help` lists them.
COMMAND_MODULES = [
    "lmforge.demo",
    "lmforge.tokenizers.cli",
    "lmforge.data.cli",
    "lmforge.pretrain",
    "lmforge.convert_cli",
    "lmforge.generate_cli",
    "lmforge.translate_cli",
    "lmforge.finetune_cli",
    "lmforge.inspect_cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmforge",
        description="Build, pretrain, fine-tune and inspect Transformer language models.",
        epilog="Input is read from standard input when TEXT is not given, one item a line. "
        "Results go to standard output as JSON lines; progress and logs go to standard error.",
    )
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except LmforgeError as err:
        print(f"lmforge: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lmforge: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
