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
import threading

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime, ServeOptions

SETTINGS = Settings(Recipe({"serve": ServeOptions, "runtime": Runtime}), flags=("serve", "runtime"))


def run_serve(args: argparse.Namespace) -> int:
    from lmforge.errors import LmforgeError

    try:
        import uvicorn

        from lmforge.serve.app import create_app
    except ImportError as err:
        raise LmforgeError(f"lmforge serve needs FastAPI and uvicorn ({err.name} is missing): "
                           "pip install 'lmforge[serve]'") from None
    from lmforge.workflows.serving import ModelService

    options: ServeOptions = args.settings["serve"]
    # the engine steps on this (main) thread, where the model was loaded, and the HTTP server runs beside it: one
    # OpenMP team of CPU threads, not two (workflows/serving.EngineThread says why that matters)
    service = ModelService.open(args.model, options, args.settings["runtime"], engine_thread=False)
    config = uvicorn.Config(create_app(service), host=options.host, port=options.port, log_level="warning",
                            timeout_graceful_shutdown=int(options.grace) or None, access_log=False)
    server = uvicorn.Server(config)
    stopped: list[int] = []

    def stop(number: int, frame) -> None:  # SIGTERM / SIGINT: stop accepting, finish what is in flight, return
        stopped.append(number)
        server.handle_exit(number, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    http = threading.Thread(target=server.run, name="lmforge-http", daemon=True)
    http.start()
    try:
        if service.engine is not None:
            service.engine.run(until=lambda: not http.is_alive() or server.started)
        else:
            while http.is_alive() and not server.started:
                http.join(0.1)
        if not server.started:
            raise LmforgeError(f"--host {options.host} --port {options.port}: the server could not listen "
                               "(is the port in use?)")
        ready = f"; {service.warmup[0]} graphs compiled in {service.warmup[1]:.0f} s" if service.warmup else ""
        print(f"lmforge serve: {service.name} on http://{options.host}:{options.port} ({options.slots} slots, "
              f"context {service.context}{ready})", file=sys.stderr, flush=True)
        if service.engine is not None:
            service.engine.run(until=lambda: not http.is_alive())  # until the drain after a signal has ended
        http.join()
    finally:
        service.close()
    if stopped:
        print(f"lmforge serve: stopped by {signal.Signals(stopped[-1]).name} after the requests in flight",
              file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP API and a chat page for a model",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory or .gguf file")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_serve)
