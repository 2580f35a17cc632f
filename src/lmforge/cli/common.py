"""What every command shares: the same spelling of ``--device``, ``--threads`` and ``--quiet``, and input lines.

Nothing here imports torch at module level: the parser is built from these helpers before any command runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator


def add_common(p: argparse.ArgumentParser, device: str | None = None, threads: bool = True,
               device_help: str = "") -> None:
    """``--quiet`` on every command; ``--device`` (default ``device``) and ``--threads`` where a model runs.

    ``device=None`` leaves ``--device`` out (commands that load no model).
    """
    p.add_argument("--quiet", action="store_true", help="no progress or logs on standard error (errors still show)")
    if device is not None:
        p.add_argument("--device", default=device, metavar="DEV",
                       help=device_help or f"cpu | cuda | cuda:N | auto (default {device})")
    if device is not None and threads:
        p.add_argument("--threads", type=int, default=0, metavar="N", help="torch CPU threads (default: torch's)")
    if device is not None:
        p.add_argument("--no-verify", action="store_true",
                       help="skip the sha256 check of model and checkpoint files (huge models)")


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count when ``--threads N`` was given (imports torch: call it in a handler),
    and turn checksum verification off for ``--no-verify``."""
    if getattr(args, "no_verify", False):
        from lmforge.manifest import set_verify

        set_verify(False)
    if getattr(args, "threads", 0):
        import torch

        torch.set_num_threads(args.threads)


def input_lines(given: list[str] | str | None, skip_blank: bool = False) -> Iterator[str]:
    """The TEXT arguments, or standard input one line at a time (without its newline)."""
    if isinstance(given, str) or given:  # "" is a text; None or [] read standard input
        yield from [given] if isinstance(given, str) else given
        return
    for line in sys.stdin:
        if skip_blank and not line.strip():
            continue
        yield line.rstrip("\n")
