"""The server in two processes: the engine steps in the first, where the model was loaded; the HTTP server runs
in a second, forked from the first once the model is ready, and the two speak over a pipe (vLLM's API server
beside its engine core, in miniature).

    stopped_by = run_split(service, options, run_http)   # the engine's process; returns when the HTTP one has ended

Why: in one process every Python thread takes the interpreter lock from the engine, and a step's ~2,000 operations
each wait for it when another thread holds it. Under a flood of bad requests the HTTP thread held the lock in 56% of
the samples (docs/benchmarks.md, issue 39): the engine's step slowed 2-4x and the other clients' first tokens with
it. Forked, the HTTP process has its own lock; it shares the model's pages without copying them (it never reads a
weight: the forked engine object only answers questions about its settings, ``Engine.check``, the slots), and
keeps the tokenizer, the chat template and the outputs stage (text, stop strings, callbacks), so that the engine's
process runs only the engine.

The messages (pickled tuples), HTTP process -> engine:
    ("submit", rid, Request)       a request, its callbacks removed       ("cancel", rid) / ("stop_at", rid, keep)
    ("job", jid, name, args)       ``service.<name>(*args)`` on the engine's thread (an attention page)
    ("cancel_all",)                a drain past its grace
engine -> HTTP process:
    ("tokens", deltas, report)     after each step: (rid, new tokens, length, finish reason, error, new
                                   log-probabilities) of each request the step touched, and the engine's load
    ("job", jid, ok, value)        a job's result, or its exception
    ("error", text)                (HTTP process -> engine, last) why the HTTP process could not serve

Signals go to the engine's process (the HTTP one leaves the terminal's process group), which passes them on: the
HTTP process drains as a lone server does, then exits with the signal's number; a pipe that ends (either process
gone) ends the other side: requests in flight end with an error and the server drains.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection, Pipe
from typing import Any, NamedTuple

from lmforge.errors import LmforgeError
from lmforge.generation.engine import Engine, Generation, Request
from lmforge.generation.requests import end
from lmforge.workflows.options import ServeOptions
from lmforge.workflows.serving import EngineThread, ModelService

GONE = (OSError, EOFError, ValueError)  # what a pipe whose other end has gone raises (ignored when sending)


class Report(NamedTuple):
    """The engine's load after a step, as the HTTP process reads it (/metrics, /health, the queue limit)."""

    received: int  # requests the engine has been sent so far
    waiting: int
    busy: int  # slots in use
    slots: int
    steps: int
    busy_s: float
    prefix_hits: int
    prefix_misses: int


def run_split(service: ModelService, options: ServeOptions, run_http: Callable[[ModelService, ServeOptions],
                                                                                 int | None]) -> int | None:
    """Fork the HTTP process (``run_http(service, options)`` there, with ``service.engine`` an ``EngineLink``) and
    step the engine here until it ends; the signal that drained it, or None. Its error is an ``LmforgeError``."""
    ours, theirs = Pipe(duplex=True)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the HTTP process: never returns
        ours.close()
        http_process(service, options, theirs, run_http)
    theirs.close()
    for sig in (signal.SIGTERM, signal.SIGINT):  # one drain, in the HTTP process
        signal.signal(sig, lambda number, _: os.kill(pid, number))
    side = EngineSide(ours, service)
    try:
        side.serve()
    finally:
        service.close()
        ours.close()
        _, status = os.waitpid(pid, 0)
    if side.error is not None:
        raise LmforgeError(side.error)
    if os.WIFSIGNALED(status):
        raise LmforgeError(f"the HTTP process ended by {signal.Signals(os.WTERMSIG(status)).name}")
    code = os.WEXITSTATUS(status)
    if code not in (0, signal.SIGTERM, signal.SIGINT):
        raise LmforgeError(f"the HTTP process failed (exit status {code}; its traceback is above)")
    return code or None


def http_process(service: ModelService, options: ServeOptions, conn: Connection, run_http) -> None:
    """The forked side: serve HTTP with the engine behind ``conn``; exit with the draining signal's number."""
    code = 1
    try:
        os.setpgid(0, 0)  # out of the terminal's group: Ctrl-C reaches the engine's process, which passes it on
        import torch

        torch.set_num_threads(1)  # never an OpenMP team here (the parent's does not survive a fork)
        service.engine = EngineLink(conn, service.engine.engine)
        code = run_http(service, options) or 0
    except LmforgeError as err:
        with contextlib.suppress(*GONE):
            conn.send(("error", str(err)))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class EngineSide:
    """The engine's process: requests from the pipe into the engine (a thread reads it), tokens back after each
    step (the engine's sink), jobs run between steps; ``serve`` steps on the calling thread until the pipe ends."""

    def __init__(self, conn: Connection, service: ModelService) -> None:
        self.conn, self.service = conn, service
        self.engine: EngineThread = service.engine
        self.lock = threading.Lock()  # the engine's thread and the reader both send
        self.by_id: dict[int, Generation] = {}  # the requests in the engine, by their HTTP process's id
        self.held: dict[Generation, tuple[int, int]] = {}  # and each one's (id, tokens handed on so far)
        self.received, self.closed, self.error = 0, False, None
        self.engine.engine.sink = self.deliver

    def serve(self) -> None:
        reader = threading.Thread(target=self.read, name="lmforge-link", daemon=True)
        reader.start()
        self.engine.run(until=lambda: self.closed)

    def send(self, message: tuple) -> None:
        with self.lock, contextlib.suppress(*GONE):
            self.conn.send(message)

    def read(self) -> None:
        try:
            while True:
                self.handle(*self.conn.recv())
        except (EOFError, OSError):
            pass
        finally:
            self.closed = True
            self.engine.cancel_all()
            self.engine.wake.set()

    def handle(self, kind: str, *args: Any) -> None:
        if kind == "submit":
            rid, request = args
            self.received += 1
            try:
                generation = self.engine.submit(request)
            except LmforgeError as err:  # checked in the HTTP process already: only a race can get here
                self.send(("tokens", [(rid, [], 0, "error", str(err), [])], self.report()))
                return
            self.by_id[rid], self.held[generation] = generation, (rid, 0)
        elif kind in ("cancel", "stop_at"):
            generation = self.by_id.get(args[0])
            if generation is not None:
                generation.cancel() if kind == "cancel" else generation.stop_at(args[1])
        elif kind == "job":
            jid, name, job_args = args
            future = self.engine.call_soon(getattr(self.service, name), *job_args)
            future.add_done_callback(lambda f: self.answer(jid, f))
        elif kind == "cancel_all":
            self.engine.cancel_all()
        elif kind == "error":
            self.error = args[0]

    def answer(self, jid: int, future: concurrent.futures.Future) -> None:
        err = future.exception()
        if err is not None and not isinstance(err, LmforgeError):
            err = LmforgeError(f"{type(err).__name__}: {err}")  # pickled whole: an error of our own
        self.send(("job", jid, err is None, future.result() if err is None else err))

    def deliver(self, touched: list[Generation]) -> None:
        """The engine's sink: what the step gave each request it touched, and the load, in one message."""
        deltas = []
        for generation in dict.fromkeys(touched):
            if generation not in self.held:
                continue
            (rid, sent), tokens = self.held[generation], generation.tokens
            deltas.append((rid, tokens[sent:], len(tokens), generation.finish_reason, generation.error,
                           generation.logprobs[sent:]))
            if generation.done:
                del self.held[generation], self.by_id[rid]
            else:
                self.held[generation] = (rid, len(tokens))
        self.send(("tokens", deltas, self.report()))

    def report(self) -> Report:
        return Report(self.received, *self.engine.load(), self.engine.steps, self.engine.busy,
                      *self.engine.prefix_counts())


class LinkedGeneration(Generation):
    """A request as the HTTP process holds it: tokens arrive from the engine's process; cancelling tells it."""

    link: EngineLink
    rid: int

    def cancel(self) -> None:
        if not self.cancelled and not self.done:  # an ended one is gone from the engine already
            self.cancelled = True
            self.link.send(("cancel", self.rid))

    def stop_at(self, keep: int) -> None:
        self.keep, self.cancelled = keep, True
        self.link.send(("stop_at", self.rid, keep))


class EngineLink:
    """What ``service.engine`` is in the HTTP process: ``EngineThread``'s face, the engine in the other process.
    ``engine``: the forked copy of the engine, never stepped, for its settings (``check``) and its outputs stage."""

    def __init__(self, conn: Connection, engine: Engine) -> None:
        self.conn, self.engine = conn, engine
        self.lock = threading.Lock()  # the event loop and the worker threads both send
        self.rids, self.jids = itertools.count(), itertools.count()
        self.generations: dict[int, LinkedGeneration] = {}
        self.jobs: dict[int, concurrent.futures.Future] = {}
        self.submitted, self.dead = 0, False
        self.report = Report(0, *engine.scheduler.load(), 0, 0.0, 0, 0)

    # -- EngineThread's face ------------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.report.steps

    @property
    def busy(self) -> float:
        return self.report.busy_s

    def load(self) -> tuple[int, int, int]:
        """(waiting, slots in use, slots): the engine's last report and what was sent since."""
        r = self.report
        return r.waiting + self.submitted - r.received, r.busy, r.slots

    def prefix_counts(self) -> tuple[int, int]:
        return self.report.prefix_hits, self.report.prefix_misses

    def submit(self, request: Request) -> Generation:
        if self.dead:
            raise LmforgeError("the engine has stopped; the server is closing")
        self.engine.check(request)  # the engine's own one-line refusals, here and at once
        generation = LinkedGeneration(request)
        generation.link, generation.rid = self, next(self.rids)
        self.generations[generation.rid] = generation
        self.submitted += 1
        self.send(("submit", generation.rid, dataclasses.replace(
            request, on_token=None, on_text=None, on_finish=None, stop_strings=(), generator=None)))
        return generation

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (a method of the service) on the engine's thread, in the engine's process."""
        if self.dead:
            raise LmforgeError("the engine has stopped; the server is closing")
        future: concurrent.futures.Future = concurrent.futures.Future()
        jid = next(self.jids)
        self.jobs[jid] = future
        self.send(("job", jid, fn.__name__, args))
        return future.result()

    def cancel_all(self) -> None:
        self.send(("cancel_all",))

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Wait until ``until()`` (the engine steps in the other process)."""
        while not until():
            time.sleep(0.05)

    def stop(self, timeout: float = 10.0) -> None:
        """Nothing to stop here: the pipe closes when this process exits (after saying why, if it must)."""

    def deliver_on(self, loop) -> None:
        """Read the engine's messages on ``loop`` (the HTTP server's event loop), where the outputs stage runs."""
        loop.add_reader(self.conn.fileno(), self.receive, loop)

    # -- the pipe -------------------------------------------------------------------------------------------------
    def send(self, message: tuple) -> None:
        with self.lock, contextlib.suppress(*GONE):
            self.conn.send(message)

    def receive(self, loop) -> None:
        try:
            while self.conn.poll():
                kind, *args = self.conn.recv()
                if kind == "tokens":
                    self.tokens(*args)
                elif kind == "job":
                    jid, ok, value = args
                    future = self.jobs.pop(jid)
                    future.set_result(value) if ok else future.set_exception(value)
        except (EOFError, OSError):
            loop.remove_reader(self.conn.fileno())
            self.gone()

    def tokens(self, deltas: list[tuple], report: Report) -> None:
        self.report = report
        touched = []
        for rid, new, length, reason, error, logprobs in deltas:
            generation = self.generations.get(rid)
            if generation is None:
                continue
            generation.tokens.extend(new)
            generation.logprobs.extend(logprobs)
            del generation.tokens[length:], generation.logprobs[length:]  # a stop string's end, cut in the engine
            if reason is not None:
                generation.finish_reason, generation.error = reason, error
                del self.generations[rid]
            touched.append(generation)
        self.engine.outputs.process(touched)

    def gone(self) -> None:
        """The engine's process has ended: every request ends with an error, and the server drains and closes."""
        self.dead = True
        ended = list(self.generations.values())
        self.generations.clear()
        for generation in ended:
            end(generation, "error", "the engine's process ended")
        self.engine.outputs.process(ended)
        for future in self.jobs.values():
            future.set_exception(LmforgeError("the engine's process ended"))
        self.jobs.clear()
        os.kill(os.getpid(), signal.SIGTERM)
