"""Faults on cue for the stop and resume tests, from outside the trainer (the trainer holds no test code).

A child process started with ``LMFORGE_TEST_KILL_AT_STEP=5`` SIGKILLs itself right after step 5 (and its
checkpoint, if any); with ``LMFORGE_TEST_SIGNAL_AT_STEP=7:TERM`` it sends itself SIGTERM after step 7. The
child must call ``install()`` before training: tests/train_toy.py does, and ``python tests/faults.py ARGS``
runs the ``lmforge`` command line with them installed.
"""

from __future__ import annotations

import os
import signal

from lmforge.train.trainer import Callback, Trainer

KILL = "LMFORGE_TEST_KILL_AT_STEP"
SIGNAL = "LMFORGE_TEST_SIGNAL_AT_STEP"


class EnvFaults(Callback):
    """Kills or signals this process after the step named in the environment."""

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        if os.environ.get(KILL) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)
        at, _, name = os.environ.get(SIGNAL, "").partition(":")
        if at == str(step):
            os.kill(os.getpid(), getattr(signal, f"SIG{name or 'TERM'}"))


def install() -> None:
    """Every Trainer made in this process from now on carries ``EnvFaults`` (when the environment asks)."""
    if not (os.environ.get(KILL) or os.environ.get(SIGNAL)):
        return
    made = Trainer.__init__

    def init(self, *args, **kwargs) -> None:
        made(self, *args, **kwargs)
        self.callbacks.append(EnvFaults())

    Trainer.__init__ = init


if __name__ == "__main__":
    from lmforge.cli.main import main

    install()
    raise SystemExit(main())
