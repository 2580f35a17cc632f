"""How many threads a CPU step runs on: all of them, or one when another process holds a core.

    ThreadPolicy       the count chosen by measurement: timed probes of the other count, and no probe of more
                       threads while other processes keep the cores busy (``lmforge.cores.OtherLoad``)

A step on two threads beside another process's busy core waits for that core: SmolLM2 float32 steps took 25-194
ms against 16 on one thread (docs/benchmarks.md). The policy finds that out by trying: every so many steps it
runs a few at the other count and keeps the faster. Trying costs the same slow steps it avoids, so a probe of
*more* threads first asks the machine (``OtherLoad``): when other processes have kept busy more of the cores
than the probe would leave them, it is put off and asked again later, and a prefill before the first decision
runs on one thread. Used by the CPU runner (runners/cpu.py) for steps whose bits do not depend on the thread
count.
"""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
from collections.abc import Callable, Iterator

from lmforge.cores import OtherLoad, fitting, threads_at


class ThreadPolicy:
    """A step's thread count chosen by measurement: the threads torch was given, or one when a second thread only waits
    (another process holds a core: a 2-thread step then runs at a half to a third of its speed, where one thread keeps
    its own; docs/benchmarks.md). Every ``period`` steps the next ``probe`` steps run at the other count, and the median
    of those against the median of the ``probe`` steps just before (the same requests, nearly the same shapes) keeps the
    faster count. A probe of more threads first asks ``load`` (``OtherLoad``): while other processes keep busy more
    cores than the probe would leave them, it is put off by ``probe`` steps, so that a busy machine never pays for a
    slow probe, and a prefill before the first decision runs on one thread. The first step after a change of count is
    not timed: the threads that just stopped still spin for a while and slow it. A probe whose first timed step takes
    1.5x the current median has lost already and ends there (so does one whose untimed first step takes 3x); a probe
    that keeps the current count doubles the period (up to ``8 * every``: probing a busy core costs), a switch sets it
    back to ``every``. Steps that have become 1.5x slower than at the last decision (a process took a core; a window of
    4 steps can also mislead) bring the next probe forward. Only for steps whose bits do not depend on the thread count
    (packed products, the quantized kernels): switching changes the time, never a token.

    ``start``: the count the first steps run at (all the threads by default). An engine of one slot starts at one
    (``CpuRunner``): its steps all have one row, so the first probe, after ``probe`` steps, compares like with
    like, and the costs are lopsided: a 2-thread step beside another process's busy core waits for that core
    (SmolLM2 float32: 25-194 ms against 16 at one thread), one thread where two were free costs ~1.2x at one row
    for the few steps until the probe. A server's steps grow from one row to many as its first requests arrive:
    a probe then compares unlike steps, and a start at one thread kept one thread for whole loads (16 clients:
    688-711 tok/s against 804-938). Prefills run at all the threads until the first decision (a prompt's speed,
    where nothing is known yet; one thread when ``load`` says the cores are busy), then at the count steps run
    at. A prompt asked before the machine can tell anything runs at all the threads: the first prompt of an engine
    on a free machine keeps its speed (fp32 at two threads ~600 prompt tokens/s against ~460 at one). The
    runner's ``load`` is the process's one (``lmforge.cores.machine``), whose first look a model's load took, so
    that its first prompt is told."""

    def __init__(self, threads: int, every: int = 128, probe: int = 4,
                 clock: Callable[[], float] = time.perf_counter, start: int | None = None,
                 load: OtherLoad | None = None) -> None:
        start = threads if start is None else start
        self.load = load  # asked before a probe of more threads (None: probe without asking)
        self.counts, self.every, self.probe, self.clock = (threads, 1), every, probe, clock
        self.current = start  # the count steps run at
        self.period = every
        self.steps = every - probe  # steps since the last decision: the first probe comes after ``probe`` steps
        self.recent: collections.deque[float] = collections.deque(maxlen=probe)  # times at the current count
        self.trial: list[float] = []  # times at the other count, while probing
        self.probing = False  # a probe under way: its steps run at the other count until ``decide``
        self.last = start  # the count the last step ran at
        self.basis = 0.0  # the current count's median step at the last decision
        self.switches = self.decisions = 0

    def other(self) -> int:
        return self.counts[1] if self.current == self.counts[0] else self.counts[0]

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Run one step at the count the policy picks now (the global count restored after) and time it."""
        due = not self.probing and self.steps >= self.period and len(self.recent) == self.probe
        if due and self.other() > self.current and not self.room_for(self.other(), unknown=False):
            self.steps -= self.probe  # other processes keep the cores: ask again later
        elif due:
            self.probing = True  # the machine is asked when a probe starts, never during one
        probing = self.probing
        count = self.other() if probing else self.current
        with threads_at(count):
            began = self.clock()
            try:
                yield
            finally:
                changed, self.last = count != self.last, count
                self.record(self.clock() - began, probing, timed=not changed)

    def after(self) -> contextlib.AbstractContextManager:
        """Run a call at the count the last step ran at (its token's choice: no change of count in between, so a
        probe's steps stay timed)."""
        return threads_at(self.last)

    def follow(self) -> contextlib.AbstractContextManager:
        """Run a call at the count steps run at now (all the threads before the first decision), untimed (a
        prefill: its shapes vary too much to compare)."""
        if self.decisions:
            self.last = self.current
        else:
            self.last = self.counts[0] if self.room_for(self.counts[0], unknown=True) else 1
        return threads_at(self.last)

    def room_for(self, threads: int, unknown: bool) -> bool:
        """Whether ``threads`` threads would find their cores free lately (``OtherLoad``): within a quarter of a
        core (the ticks' error over a look) of the room other processes leave. Not half: while this process ran on
        two threads beside a spinning one, the spinner got ~half a core and the room looked like 1.5. True without
        a way to tell; ``unknown`` while nothing can be told yet (a probe waits for an answer; a prompt, a one-off,
        runs as it did before anything was known)."""
        if self.load is None or not self.load.available:
            return True
        room = self.load.room()
        return unknown if room is None else fitting(threads, room) == threads

    def record(self, took: float, probing: bool, timed: bool = True) -> None:
        self.steps += 1
        if not timed:  # slow anyway (threads still spinning, or waking); 3x slower, a probe has lost already
            if probing and self.recent and took > 3 * statistics.median(self.recent):
                self.decide([])
            return
        if not probing:
            self.recent.append(took)
            if self.basis and len(self.recent) == self.probe and statistics.median(self.recent) > 1.5 * self.basis:
                self.steps, self.basis = self.period, 0.0  # slower than when decided: probe now
            return
        self.trial.append(took)
        if len(self.trial) < self.probe and took < 1.5 * statistics.median(self.recent):
            return
        self.decide(self.trial)

    def decide(self, trial: list[float]) -> None:
        """The end of a probe: its timed steps ``trial`` against the current count's recent ones."""
        usual = statistics.median(self.recent)
        self.trial, self.steps, self.decisions, self.probing = [], 0, self.decisions + 1, False
        if len(trial) == self.probe and statistics.median(trial) < 0.9 * usual:
            self.current, self.switches, self.period = self.other(), self.switches + 1, self.every
            self.recent.clear()
            self.basis = statistics.median(trial)
        else:
            self.period, self.basis = min(2 * self.period, 8 * self.every), usual
