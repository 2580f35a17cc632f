"""The server process: the decoding engine stepping on the main thread, the HTTP server (uvicorn) in a process of
its own forked from this one (``split``, the default) or in a thread beside the engine (``--no-http-process``).

    service = ModelService.open(path, options, runtime, engine_thread=False)   # the engine is stepped here
    stopped_by = run(service, options)     # returns once a SIGTERM / SIGINT's drain has ended (the signal), or raises

A signal drains the server (``Drain``): requests in flight finish (up to ``--grace`` seconds) while new ones and
/health get 503 with Retry-After, then the listener closes.

Why the engine, not the HTTP server, keeps the main thread: the model was loaded there, and PyTorch's CPU threads
come from OpenMP, which keeps one team of workers for each thread that runs parallel work. Stepping the engine on
a second thread makes a second team; libgomp then has more threads than cores, spins only briefly before sleeping,
and every parallel region of a step pays a wake-up, so a step is slower on a second thread than on the loading one
(measured: docs/serving.md). Why the HTTP server in another process: there its Python work never holds the
interpreter lock that each of the engine's operations takes back (``split``).
"""

from __future__ import annotations

import functools
import os
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
    """Serve until SIGTERM or SIGINT has drained the server (``Drain``); the signal's number, or None. A server
    that cannot listen is an ``LmforgeError``. With an engine and ``--http-process`` (the default where the system
    can fork), the HTTP server runs in a second process (``split``), else in a thread beside the engine."""
    if http_process(service, options):
        from lmforge.serve.split import run_split

        return run_split(service, options, functools.partial(serve_http, layout="HTTP in a process of its own"))
    return serve_http(service, options)


def http_process(service: ModelService, options: ServeOptions) -> bool:
    """Whether the HTTP server gets a process of its own: ``--http-process``, else when a core is left beside the
    engine's threads. Measured on 2 cores (docs/serving.md): with a core to spare, 16 hostile clients slow the
    normal ones' first tokens 1.95-1.97x in two processes against 3.47-3.51x in one; without one, the HTTP
    process takes it from the engine's OpenMP team (alone: 10-15% fewer tokens a second), so a thread is kept."""
    if service.engine is None or not hasattr(os, "fork"):
        return False
    if options.http_process is not None:
        return options.http_process
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return cores > torch.get_num_threads()


def serve_http(service: ModelService, options: ServeOptions, layout: str = "HTTP in a thread") -> int | None:
    """The HTTP server in a thread, the engine (or, in the HTTP process, its link) waited on in this one."""
    app = create_app(service)
    config = uvicorn.Config(app, host=options.host, port=options.port, log_level="warning",
                            timeout_graceful_shutdown=5, access_log=False)
    server = uvicorn.Server(config)
    drain = Drain(server, app.state.lmforge, service, options.grace)
    for sig in (signal.SIGTERM, signal.SIGINT):  # uvicorn listens for signals on the main thread only: ours
        signal.signal(sig, drain.begin)
    http = threading.Thread(target=server.run, name="lmforge-http", daemon=True)
    http.start()
    try:
        step_until(service, lambda: not http.is_alive() or server.started)
        if not server.started:
            raise LmforgeError(f"--host {options.host} --port {options.port}: the server could not listen "
                               "(is the port in use?)")
        if (warning := exposure_warning(options)) is not None:
            print(f"lmforge serve: warning: {warning}", file=sys.stderr, flush=True)
        graphs, seconds, how = service.warmup or (0, 0.0, "")
        ready = f"; {graphs} graph{'s' * (graphs != 1)} {how} in {seconds:.1f} s" if graphs else ""
        print(f"lmforge serve: {service.name} on http://{options.host}:{options.port} ({service.load()[2]} slots, "
              f"context {service.context}{ready}; {layout})", file=sys.stderr, flush=True)
        step_until(service, lambda: not http.is_alive() or drain.over())  # until the drain after a signal has ended
        http.join()
    finally:
        service.close()
    return drain.signal


def exposure_warning(options: ServeOptions) -> str | None:
    """What to say when the server listens beyond this machine with no key, else None."""
    if options.host in ("127.0.0.1", "localhost", "::1") or options.api_key:
        return None
    return (f"--host {options.host} listens beyond this machine and no --api-key is set: anyone who reaches the "
            "port can use the model")


class Drain:
    """What SIGTERM / SIGINT start: new requests (and /health) get 503 with Retry-After while the requests in
    flight finish, for up to ``grace`` seconds; then what is left is cancelled and the server closes. A second
    signal closes it at once."""

    def __init__(self, server: uvicorn.Server, state, service: ModelService, grace: float) -> None:
        self.server, self.state, self.service, self.grace = server, state, service, grace
        self.signal: int | None = None
        self.deadline = 0.0

    def begin(self, number: int, frame) -> None:
        if self.signal is not None:  # the second signal: now
            self.server.handle_exit(number, frame)
            return
        self.signal, self.deadline = number, time.monotonic() + self.grace
        self.state.draining = True

    def over(self) -> bool:
        """Whether the drain has ended (checked between engine steps): then the HTTP server is told to close."""
        if self.signal is None or self.server.should_exit:
            return False
        if self.state.in_flight and time.monotonic() < self.deadline:
            return False
        self.service.cancel_all()  # past the grace: streams still open end now
        self.server.handle_exit(self.signal, None)
        return False  # the HTTP thread ends once uvicorn has closed: step_until sees it


def step_until(service: ModelService, done) -> None:
    """Step the service's engine on this thread until ``done()``; a model without one (an encoder) just waits."""
    if service.engine is not None:
        service.engine.run(until=done)
        return
    while not done():
        time.sleep(0.1)
