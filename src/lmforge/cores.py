"""The CPU cores this process may use, and how many of them other processes keep busy right now.

    threads_at(n)      torch's CPU work on n threads inside a block (the count restored after)
    one_thread()       the same with n = 1
    OtherLoad          the cores other processes kept busy lately (/proc/stat less this process's own time)
    machine()          the process's one ``OtherLoad``, whose first look is taken at the first call
    fitting_threads()  torch's CPU work on the threads the cores left free lately hold (all of them when nothing
                       can be told yet)

A thread of ours on a core another process keeps busy only waits for it, and makes the others wait at every
parallel region: loading SmolLM2 as int8 on two threads beside one busy core took 3.4 s against 1.9 s on one
(docs/benchmarks.md). A model's load looks at the machine first (``fitting_threads``), and the decoding engine's
thread policy (generation/runners/threads.py) asks before it tries more threads. torch is imported when a count
is set, not with this module.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def threads_at(threads: int) -> Iterator[None]:
    """torch's CPU work on ``threads`` threads inside the block, the thread count as it was after."""
    import torch

    before = torch.get_num_threads()
    if threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if threads != before:
            torch.set_num_threads(before)


def one_thread() -> contextlib.AbstractContextManager:
    """torch's CPU work on one thread inside the block, the thread count as it was after."""
    return threads_at(1)


class OtherLoad:
    """The cores that other processes kept busy since the last look: the busy time of the CPUs this process may
    run on (``/proc/stat``'s per-CPU lines: a container's cpuset, not the whole host) less this process's own
    (``/proc/self/stat``), over the wall time between looks. Linux; elsewhere ``available`` is False.

    The kernel counts CPU time in ticks (10 ms at 100 Hz), so a look over less than ``least`` seconds tells
    nothing: it keeps the window growing and answers as the last window did (None before any: a load's two
    quantizing passes, or a prompt right after a probe's look, ask within moments and get one answer)."""

    def __init__(self, least: float = 0.1, clock: Callable[[], float] = time.monotonic) -> None:
        self.least, self.clock = least, clock
        self.cpus = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = self.sample()
        self.available = self.last is not None
        self.answer: float | None = None  # the last window's busy cores

    def sample(self) -> tuple[float, float, float] | None:
        """(now, busy seconds of our CPUs, this process's CPU seconds), or None without /proc."""
        try:
            stat, own_stat = Path("/proc/stat").read_text(), Path("/proc/self/stat").read_text()
        except OSError:
            return None
        lines = [line.split() for line in stat.splitlines() if line.startswith("cpu") and line[3].isdigit()]
        own = own_stat.rsplit(")", 1)[1].split()  # fields from the 3rd (state) on
        ticks = 0
        for cpu in lines:
            if int(cpu[0][3:]) in self.cpus:
                n = [int(v) for v in cpu[1:8]]  # user nice system idle iowait irq softirq
                ticks += sum(n) - n[3] - n[4]
        return self.clock(), ticks / self.hz, (int(own[11]) + int(own[12])) / self.hz  # utime + stime

    def busy_cores(self) -> float | None:
        """Cores other processes kept busy since the last answer; the last answer again when that is too short to
        tell; None before any (or without /proc)."""
        now = self.sample()
        if now is None or self.last is None or now[0] - self.last[0] < self.least:
            return self.answer if now is not None else None
        (t0, busy0, own0), self.last = self.last, now
        self.answer = max(0.0, (now[1] - busy0) - (now[2] - own0)) / (now[0] - t0)
        return self.answer

    def room(self) -> float | None:
        """Cores free for this process lately (its CPUs less the others' busy ones), or None (``busy_cores``)."""
        busy = self.busy_cores()
        return None if busy is None else len(self.cpus) - busy


SHARED: list[OtherLoad] = []


def machine() -> OtherLoad:
    """The process's one ``OtherLoad``: its first look is taken at the first call (a model's load), so that what
    asks next (the engine's first prompt, seconds later) finds a window long enough to tell."""
    if not SHARED:
        SHARED.append(OtherLoad())
    return SHARED[0]


def fitting(threads: int, room: float | None) -> int:
    """The threads of ``threads`` whose cores were free lately: all when ``room`` is None (nothing can be told),
    else the room rounded up from a quarter of a core (the ticks' error over a look), at least one.

    >>> fitting(2, None), fitting(2, 1.9), fitting(2, 1.1), fitting(4, 2.8), fitting(2, 0.1)
    (2, 2, 1, 3, 1)
    """
    return threads if room is None else max(1, min(threads, int(room + 0.25)))


def fitting_threads(load: OtherLoad | None = None) -> contextlib.AbstractContextManager:
    """torch's CPU work inside the block on the threads it has whose cores other processes left free since the
    last look (``machine()`` by default); all of them while nothing can be told (no window long enough yet, or no
    /proc)."""
    import torch

    load = load or machine()
    threads = torch.get_num_threads()
    return threads_at(fitting(threads, load.room() if load.available and threads > 1 else None))
