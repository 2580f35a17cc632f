"""The server process: the HTTP server (uvicorn) in a thread, the decoding engine stepping on the calling thread.

    service = ModelService.open(path, options, runtime, engine_thread=False)   # the engine is stepped here
    stopped_by = run(service, options)     # returns once a SIGTERM / SIGINT's drain has ended (the signal), or raises

Why the engine, not the HTTP server, keeps the main thread: the model was loaded there, and PyTorch's CPU threads
come from OpenMP, which keeps one team of workers for each thread that runs parallel work. Stepping the engine on
a second thread makes a second team; libgomp then has more threads than cores, spins only briefly before sleeping,
and every parallel region of a step pays a wake-up (a SmolLM2 step 180-200 ms on a second thread against 120-130
ms on the loading one; docs/serving.md). uvicorn's event loop only parses, submits and streams (2% of a core).
"""

from __future__ import annotations

import signal
import sys
import threading
import time

import uvicorn

from lmforge.errors import LmforgeError
from lmforge.serve.app import create_app
from lmforge.workflows.options import ServeOptions
from lmforge.workflows.serving import ModelService


def run(service: ModelService, options: ServeOptions) -> int | None:
    """Serve until SIGTERM or SIGINT has stopped new requests and the ones in flight have finished (up to
    ``options.grace`` seconds); the signal's number, or None. A server that cannot listen is an ``LmforgeError``."""
    config = uvicorn.Config(create_app(service), host=options.host, port=options.port, log_level="warning",
                            timeout_graceful_shutdown=int(options.grace) or None, access_log=False)
    server = uvicorn.Server(config)
    stopped: list[int] = []

    def stop(number: int, frame) -> None:  # uvicorn listens for signals on the main thread only: pass them on
        stopped.append(number)
        server.handle_exit(number, frame)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    http = threading.Thread(target=server.run, name="lmforge-http", daemon=True)
    http.start()
    try:
        step_until(service, lambda: not http.is_alive() or server.started)
        if not server.started:
            raise LmforgeError(f"--host {options.host} --port {options.port}: the server could not listen "
                               "(is the port in use?)")
        graphs, seconds = service.warmup or (0, 0.0)
        ready = f"; {graphs} graph{'s' * (graphs != 1)} compiled in {seconds:.0f} s" if graphs else ""
        print(f"lmforge serve: {service.name} on http://{options.host}:{options.port} ({options.slots} slots, "
              f"context {service.context}{ready})", file=sys.stderr, flush=True)
        step_until(service, lambda: not http.is_alive())  # until the drain after a signal has ended
        http.join()
    finally:
        service.close()
    return stopped[-1] if stopped else None


def step_until(service: ModelService, done) -> None:
    """Step the service's engine on this thread until ``done()``; a model without one (an encoder) just waits."""
    if service.engine is not None:
        service.engine.run(until=done)
        return
    while not done():
        time.sleep(0.1)
