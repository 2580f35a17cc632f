"""What every command shares: one-line usage errors, checked numbers, ``--device``/``--threads``/``--quiet``
spelled the same everywhere, and input lines read with one UTF-8 rule.

Nothing here imports torch at module level: the parser is built from these helpers before any command runs.

    >>> positive_int("3"), fraction("0.1"), probability("1")
    (3, 0.1, 1.0)
    >>> positive_int("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 1, got '0'
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator

from lmforge.errors import LmforgeError


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on standard error (exit 2), like every other error.

    ``lmforge generate --beams 0`` → ``lmforge: error: lmforge generate: argument --beams/-b: must be ...``;
    ``--help`` still prints the whole usage.
    """

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"lmforge: error: {self.prog}: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


def _number(kind: type, text: str, ok, rule: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}") from None
    if (isinstance(value, float) and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 1, "an integer >= 1")


def non_negative_int(text: str) -> int:
    return _number(int, text, lambda v: v >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(float, text, lambda v: v > 0, "a number > 0")


def non_negative_float(text: str) -> float:
    return _number(float, text, lambda v: v >= 0, "a number >= 0")


def fraction(text: str) -> float:
    """A share in [0, 1): of documents held out, of steps spent warming up, of units dropped."""
    return _number(float, text, lambda v: 0 <= v < 1, "a number in [0, 1)")


def probability(text: str) -> float:
    """A probability mass in (0, 1] (top-p, confidence)."""
    return _number(float, text, lambda v: 0 < v <= 1, "a number in (0, 1]")


def add_common(p: argparse.ArgumentParser, device: str | None = None, threads: bool = True,
               device_help: str = "") -> None:
    """``--quiet`` on every command; ``--device`` (default ``device``) and ``--threads`` where a model runs.

    ``device=None`` leaves ``--device`` out (commands that load no model).
    """
    p.add_argument("--quiet", action="store_true", help="no progress or logs on standard error (errors still show)")
    if device is not None:
        p.add_argument("--device", default=device, metavar="DEV",
                       help=device_help or f"cpu | cuda | cuda:N | mps | auto (default {device})")
    if device is not None and threads:
        p.add_argument("--threads", type=positive_int, default=0, metavar="N",
                       help="torch CPU threads (default: torch's)")
    if device is not None:
        p.add_argument("--no-verify", action="store_true",
                       help="skip the sha256 check of model and checkpoint files (huge models)")


def training_shortcuts(args: argparse.Namespace) -> list[str]:
    """--device / --precision / --compile as the recipe overrides they stand for (a flag wins over the recipe)."""
    out = [f"train.device={args.device}"] if args.device else []
    out += [f"train.precision={args.precision}"] if args.precision else []
    out += ["train.compile=true"] if args.compile else []
    return out


def add_training_flags(p: argparse.ArgumentParser, section: str = "train") -> None:
    """The flags users of transformers and nanoGPT reach for, as shortcuts of the recipe's keys."""
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"],
                   help=f"autocast precision ({section}.precision; auto: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--compile", action="store_true", default=None, help=f"torch.compile the model ({section}.compile)")
    p.add_argument("--print-config", action="store_true", help="print the resolved recipe as YAML and exit")


def add_input_errors(p: argparse.ArgumentParser) -> None:
    """``--errors``: what to do with invalid UTF-8 in the input (files and standard input alike)."""
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with the line and byte offset (default), or replace the bad bytes "
                   "by U+FFFD")


def apply_runtime(args: argparse.Namespace) -> None:
    """Set torch's CPU threads (``--threads N``), check ``--device`` before any work (imports torch), and turn
    checksum verification off for ``--no-verify``."""
    if getattr(args, "no_verify", False):
        from lmforge.manifest import set_verify

        set_verify(False)
    if getattr(args, "threads", 0):
        import torch

        torch.set_num_threads(args.threads)
    if getattr(args, "device", None) not in (None, "auto"):
        from lmforge.nn.device import resolve_device

        resolve_device(args.device, "--device")



def input_lines(given: list[str] | str | None, skip_blank: bool = False, errors: str = "strict") -> Iterator[str]:
    """The TEXT arguments, or standard input one line at a time (without its newline).

    Standard input is read as bytes and decoded like files: invalid UTF-8 stops with the line number and
    byte offset, unless ``errors="replace"`` (``--errors replace``) substitutes U+FFFD.
    """
    if isinstance(given, str) or given:  # "" is a text; None or [] read standard input
        yield from [given] if isinstance(given, str) else given
        return
    raw_lines = getattr(sys.stdin, "buffer", None) or sys.stdin  # bytes, unless stdin was replaced by text
    for n, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8", errors=errors) if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as err:
            raise LmforgeError(f"<stdin> line {n}: invalid UTF-8 at byte offset {err.start} "
                               "(fix the input or pass --errors replace)") from None
        line = line.rstrip("\n").removesuffix("\r")
        if skip_blank and not line.strip():
            continue
        yield line
