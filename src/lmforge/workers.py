"""Worker processes that leave nothing behind: the one way lmforge starts a pool (tokenizer training, encoding,
corpus preparation).

A forked worker inherits its parent's open files and signal handlers. Left as they are, a stop goes wrong in
three ways: the worker keeps the run directory's lock file open (so the lock outlives the run), it runs the
parent's SIGTERM handler (a traceback per worker), and it survives its parent's death (an orphan blocked on a
queue). ``pool`` starts each worker with ``start_worker``, which undoes all three: the inherited lock files
closed, SIGINT ignored (the parent decides) and SIGTERM back to its default, and on Linux a request to the
kernel to send it SIGTERM when the parent dies, however the parent dies. Leaving the ``with pool(...)`` block
(normally, or early: an exception, a signal turned into one) terminates the workers, within a bounded time:
CPython's ``Pool.terminate`` can wait forever for the task queue's lock when an idle worker holds it while
waiting for a task (python/cpython#78178, #73945), so after ``GRACE`` seconds the workers are killed instead.

    >>> with pool(2) as workers:
    ...     workers.map(abs, [-1, -2, 3])
    [1, 2, 3]
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.pool
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent ends (Linux); exit now if it already has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # no prctl: leaving the pool's block still ends it
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died between fork and prctl
        os._exit(1)


def close_inherited_locks() -> None:
    """Close this process's copies of the parent's run-directory locks: only the parent holds them."""
    from lmforge.lock import _HELD

    for handle, _depth in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(handle.fileno())
    _HELD.clear()


def start_worker(parent: int, initializer: Callable[..., None] | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with_parent(parent)
    close_inherited_locks()
    if initializer is not None:
        initializer(*initargs)


GRACE = 10.0  # seconds Pool.terminate may take before the workers are killed


@contextlib.contextmanager
def pool(workers: int, initializer: Callable[..., None] | None = None, initargs: tuple[Any, ...] = ()
         ) -> Iterator[multiprocessing.pool.Pool]:
    """A forked pool of ``workers`` processes started by ``start_worker``, ended when the block is left."""
    processes = multiprocessing.get_context("fork").Pool(workers, initializer=start_worker,
                                                         initargs=(os.getpid(), initializer, initargs))
    try:
        yield processes
    finally:
        end(processes)


def end(processes: multiprocessing.pool.Pool, grace: float = GRACE) -> None:
    """``processes.terminate()``, bounded: if it has not returned after ``grace`` seconds (a lock that an idle
    worker holds), the workers are killed, so that none outlives the run; the stuck call stays in a daemon
    thread, which the interpreter does not wait for."""
    stopper = threading.Thread(target=processes.terminate, daemon=True, name="lmforge-pool-terminate")
    stopper.start()
    stopper.join(grace)
    if stopper.is_alive():
        for worker in list(getattr(processes, "_pool", [])):
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.kill(worker.pid, signal.SIGKILL)
