"""Multi-process batch encoding: the same method on many inputs, spread over worker processes.

Workers are forked, so they inherit the tokenizer (and its per-word cache) instead of receiving a
pickled copy; only the inputs and the results travel. Garbage collection is paused while
encoding: a batch creates millions of small lists and tuples, and collecting them would cost
more than the encoding itself.

    >>> map_in_processes(str, "upper", [("ab",), ("c",)], {}, workers=1)      # doctest: +SKIP
    ['AB', 'C']
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from lmforge.workers import pool

_WORKER_OBJECT: Any = None


def _run(method: str, jobs: Sequence[tuple], kwargs: dict[str, Any], obj: Any = None) -> list:
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        fn = getattr(_WORKER_OBJECT if obj is None else obj, method)
        return [fn(*job, **kwargs) for job in jobs]
    finally:
        if gc_was_enabled:
            gc.enable()


def _run_part(part: tuple[str, Sequence[tuple], dict[str, Any]]) -> list:
    return _run(*part)


def map_in_processes(obj: Any, method: str, jobs: Sequence[tuple], kwargs: dict[str, Any],
                     workers: int = 1) -> list:
    """``[obj.method(*job, **kwargs) for job in jobs]``, in ``workers`` forked processes when > 1.

    Results keep the order of ``jobs``; each worker gets about four chunks (for load balance).
    """
    global _WORKER_OBJECT
    if workers <= 1 or len(jobs) < 2:
        return _run(method, jobs, kwargs, obj)
    size = -(-len(jobs) // (workers * 4))
    parts = [(method, jobs[i:i + size], kwargs) for i in range(0, len(jobs), size)]
    _WORKER_OBJECT = obj
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the results are unpickled here: millions of small objects again
    try:
        with pool(workers) as processes:
            results = processes.map(_run_part, parts)
    finally:
        _WORKER_OBJECT = None
        if gc_was_enabled:
            gc.enable()
    return [r for part in results for r in part]
