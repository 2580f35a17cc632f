"""One writer per run directory: an OS file lock that a second run sees at once and a crash never leaves behind.

``RunLock(out)`` takes an exclusive ``flock`` on ``out/.lock`` and writes its process id into it. The
kernel drops the lock when the process ends, however it ends (exit, exception, SIGKILL, power cut), so
there is never a stale lock to delete by hand: the file may stay, the lock does not. A second run on the
same directory fails at once with one line naming the holder's PID. Re-entrant within one process
(a workflow and the trainer it starts may both take it).

    >>> import tempfile; d = tempfile.mkdtemp()
    >>> with RunLock(d), RunLock(d):      # the same process may take it twice
    ...     Path(d, ".lock").read_text().strip() == str(os.getpid())
    True
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

try:
    import fcntl
except ImportError:  # Windows: no flock; runs are not locked there
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".lock"
_HELD: dict[Path, list[Any]] = {}  # lock path -> [open file, depth]: re-entrant within a process


class RunLock:
    """Exclusive lock on a directory for the life of a ``with`` block (or until ``release``)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.path = Path(directory).resolve() / LOCK_NAME

    def acquire(self) -> RunLock:
        held = _HELD.get(self.path)
        if held is not None:
            held[1] += 1
            return self
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise LmforgeError(f"{self.path.parent}: is a file, not a directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (held until release)  append-only: the lock
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                holder = f.read().strip() or "unknown"
                f.close()
                raise LmforgeError(f"{self.path.parent}: in use by another lmforge run (pid {holder}); wait for "
                                   "it to finish or choose another --out") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
        except OSError as err:  # a full disk: no empty lock file left behind, the lock let go
            self.path.unlink(missing_ok=True)
            f.close()
            raise LmforgeError(f"{self.path}: cannot write the run's lock ({err.strerror}); free some space and run "
                               "the command again") from None
        _HELD[self.path] = [f, 1]
        return self

    def release(self) -> None:
        held = _HELD.get(self.path)
        if held is None:
            return
        held[1] -= 1
        if held[1] == 0:
            del _HELD[self.path]
            held[0].close()  # closing the file drops the flock

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
