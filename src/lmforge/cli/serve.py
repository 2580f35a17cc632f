"""``lmforge serve``: an OpenAI-compatible HTTP API over the decoding engine, and a chat page at /.

    lmforge serve --model $(python -m lmforge.data.sources path smollm2)          # http://127.0.0.1:8000
    curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}'

Routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/classify; GET /v1/models, /health,
/metrics, / (the chat page). Concurrent requests share the engine's slots (continuous batching). One JSON line per
request on standard error. SIGTERM (or Ctrl-C) stops accepting, lets the streams in flight finish for up to
--grace seconds, then exits 0. Binds 127.0.0.1 unless --host says otherwise. Needs ``pip install 'lmforge[serve]'``.
"""

from __future__ import annotations

import argparse
import signal
import sys

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime, ServeOptions, TemplateOptions, Weights

SETTINGS = Settings(Recipe({"serve": ServeOptions, "runtime": Runtime, "template": TemplateOptions,
                            "weights": Weights}), flags=("serve", "runtime", "template", "weights"))


def run_serve(args: argparse.Namespace) -> int:
    from lmforge.errors import LmforgeError

    try:
        from lmforge.serve.process import run
    except ImportError as err:
        raise LmforgeError(f"lmforge serve needs FastAPI and uvicorn ({err.name} is missing): "
                           "pip install 'lmforge[serve]'") from None
    from lmforge.workflows.serving import ModelService

    options: ServeOptions = args.settings["serve"]
    service = ModelService.open(args.model, options, args.settings["runtime"], engine_thread=False,  # run() steps it
                                template=args.settings["template"], weights=args.settings["weights"])
    stopped = run(service, options)
    if stopped is not None:
        print(f"lmforge serve: stopped by {signal.Signals(stopped).name} after the requests in flight",
              file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP API and a chat page for a model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory or .gguf file")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_serve)
