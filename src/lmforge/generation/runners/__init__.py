"""Runners: the model's side of the decoding engine, one per device family (the engine and the scheduler do not
change between them).

    eager.py      EagerRunner     the readable reference: plain calls, exact shapes (other devices; parity tests)
    cpu.py        CpuRunner       packed products, the thread policy, exact rows, one compiled step (compile=True)
    compiled.py   CompiledRunner  a graph per bucket, CUDA graphs on a GPU (the default on CUDA)

``make_runner`` picks one; ``compile`` means one thing everywhere: compile the step before serving it (on a CPU
the one dynamic graph when the model is a float32 decoder, else a graph per bucket).
"""

from __future__ import annotations

from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.runners.eager import EagerRunner

KINDS = ("eager", "cpu", "compiled")


def make_runner(model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                prefix_blocks: int = 0, pad_id: int = 0, compile: bool | None = None,
                kind: str | None = None) -> EagerRunner:
    """The runner for ``model`` on its device (``kind`` to choose one by name; see the module docstring)."""
    from lmforge.generation.runners.compiled import CompiledRunner
    from lmforge.generation.runners.cpu import CpuRunner, fits_one_graph

    if kind is not None and kind not in KINDS:
        raise LmforgeError(f"runner: {kind!r} is not one of {', '.join(KINDS)}")
    device = next(model.parameters()).device.type
    if kind is None:
        if device == "cpu":
            kind = "compiled" if compile and not fits_one_graph(model) else "cpu"
        else:
            kind = "compiled" if (compile if compile is not None else device == "cuda") else "eager"
    args = (model, slots, capacity, memory, start_id, prefix_blocks, pad_id)
    if kind == "cpu":
        return CpuRunner(*args, compile=bool(compile))
    return CompiledRunner(*args) if kind == "compiled" else EagerRunner(*args)
