"""The ``lmforge`` command line: a thin shell over the Python API (see ``main``).

One module per command group; each has ``add_commands(subparsers)`` and handlers that parse arguments and
call the workflows or the engine. No logic lives here, and nothing in the engine or the workflows imports
this package. Building the parser imports no torch, numpy or matplotlib: a handler imports what it needs.
"""

from lmforge.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
