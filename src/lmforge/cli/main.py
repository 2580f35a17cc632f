"""``lmforge``: collect the command groups, run the chosen handler, turn ``LmforgeError`` into one line.

Output contract, the same for every command: results go to standard output as JSON lines (or plain text
where a command says so), progress and logs to standard error; ``--quiet`` keeps only results and errors.
Building the parser imports only the standard library: ``lmforge --version`` and ``lmforge COMMAND --help``
answer without loading torch.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import signal
import sys
import threading

from lmforge import __version__
from lmforge.cli.common import Parser, resolve_settings
from lmforge.errors import LmforgeError, Stopped

# Command-group modules (lmforge.cli.<name>), in the order `lmforge --help` lists them.
COMMAND_GROUPS = ["demo", "tokenizer", "data", "pretrain", "convert", "generate", "chat", "serve", "translate",
                  "finetune", "inspect"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="lmforge",
        description="Build, pretrain, fine-tune and inspect Transformer language models.",
        epilog="Input is read from standard input when TEXT is not given, one item a line. "
        "Results go to standard output as JSON lines; progress and logs go to standard error.",
    )
    parser.add_argument("--version", action="version", version=f"lmforge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_GROUPS:
        importlib.import_module(f"lmforge.cli.{name}").add_commands(sub)
    return parser


def print_settings(settings: dict) -> None:
    """``--print-config``: the resolved settings as YAML, ready to be saved and passed back with --config."""
    import yaml

    from lmforge.schema import plain

    print(yaml.safe_dump(plain(settings), sort_keys=False), end="")


@contextlib.contextmanager
def quiet_stderr(enabled: bool):
    """With --quiet, progress and logs written to standard error are dropped; errors still reach it."""
    if not enabled:
        yield
        return
    real, sys.stderr = sys.stderr, io.StringIO()
    try:
        yield
    finally:
        sys.stderr = real


def stop_on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM outside training (which checkpoints first): unwind like Ctrl-C, so worker pools terminate and
    locks are released on the way out, then one line and exit 143."""
    raise Stopped("stopped by SIGTERM", signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return run(args)
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        return run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> int:
    """The handler, with every way it can end turned into an exit code and at most one line."""
    try:
        with quiet_stderr(getattr(args, "quiet", False)):
            if hasattr(args, "schema"):  # the command's settings: defaults < --config < KEY=VALUE < flags
                args.settings = resolve_settings(args)
                if args.print_config:
                    print_settings(args.settings)
                    return 0
                if "runtime" in args.settings:
                    args.settings["runtime"].apply()
            return int(args.handler(args) or 0)
    except LmforgeError as err:
        print(f"lmforge: error: {err}", file=sys.stderr)
        return 2
    except Stopped as stop:  # SIGINT / SIGTERM during training: the checkpoint is saved, the line says where
        print(f"lmforge: {stop}", file=sys.stderr)
        return stop.exit_code
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly, as Unix tools do
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except OSError as err:  # the file system said no (permissions, a directory for a file, a full disk, ...)
        from lmforge.files import disk_full

        if err.filename is None and not disk_full(err):
            raise
        where = err.filename or "a write failed"
        print(f"lmforge: error: {where}: {err.strerror}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("lmforge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
