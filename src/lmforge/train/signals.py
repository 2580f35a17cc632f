"""Graceful stop: SIGINT (Ctrl-C) or SIGTERM (SLURM, Kubernetes, a preempted VM) loses no work.

While the trainer runs, the two signals only raise a flag. The loop finishes the optimizer step under
way, writes a checkpoint at that step (atomically, as every checkpoint), and raises ``Stopped``: the CLI
prints its one line (where the checkpoint is, how to resume) and exits 128 + the signal (130 for SIGINT,
143 for SIGTERM). Schedulers give ~30 s between SIGTERM and SIGKILL; a step and a save fit in that.

    signal 1     stop after this step, save, exit
    signal 2     ignored (a line says the save is under way): a half-written checkpoint helps no one
    signal 3     exit at once, without saving (the previous checkpoint stays intact)

Under DDP/FSDP the flag is summed over the processes (one small all-reduce) at the steps where the host
reads the device anyway (log, eval, save steps: no extra wait in between), so every rank stops after the
same step even when the signal reached only one of them, and the save (a collective) happens on all of
them; a stop then waits for the next log step (keep log_every within the ~30 s a scheduler gives).
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType
from typing import Any

import torch

from lmforge.errors import Stopped
from lmforge.train import distributed as D
from lmforge.train.logs import info

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class GracefulStop:
    """Turns SIGINT / SIGTERM into a request the training loop checks after each step."""

    def __init__(self, env: D.DistEnv, device: torch.device) -> None:
        self.env, self.device = env, device
        self.signum = 0  # the first signal received (0: none)
        self.count = 0
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # only the main thread may handle signals; a trainer in a thread stops as before
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            self.signum = signum
            info(f"{name} received: finishing this step and saving a checkpoint (a third signal quits at once)")
        elif self.count == 2:
            info(f"{name} again: still saving the checkpoint; one more signal quits without it")
        else:
            info(f"{name} a third time: quitting without saving (the previous checkpoint is intact)")
            os._exit(128 + signum)

    def requested(self) -> int:
        """The signal to stop for (0: go on), the same on every process of the run."""
        if not self.env.enabled:
            return self.signum
        flags = torch.tensor([float(self.signum == sig) for sig in SIGNALS], device=self.device)
        interrupts, terminates = D.all_reduce_sum(flags, self.env).tolist()  # how many processes got each
        return self.signum or (int(signal.SIGTERM) if terminates else int(signal.SIGINT) if interrupts else 0)

    @staticmethod
    def stopped(signum: int, step: int, checkpoint: Any) -> Stopped:
        name = signal.Signals(signum).name
        return Stopped(f"stopped by {name} after step {step}; checkpoint {checkpoint}; run the same command "
                       "again to resume from it", signum)
