"""Runners: the model's side of the decoding engine, one per device family (the engine and the scheduler do not
change between them).

    eager.py      EagerRunner     the readable reference: plain calls, exact shapes (other devices; parity tests)
    cpu.py        CpuRunner       packed products, the thread policy, exact rows, one compiled step (compile=True)
    graphs.py     GraphRunner     the lean step recorded once per column width as a CUDA graph (the default on
                                  CUDA for decoders; seconds to record; ``compile=True``: the step compiled by
                                  torch.compile first, fewer kernels, tens of seconds a width at the first start)
    compiled.py   CompiledRunner  ``torch.compile`` per bucket (on CUDA: models the lean step does not fit)
    threads.py    ThreadPolicy    the CPU runner's thread count: measured, and one thread while other processes
                                  keep the cores busy

``make_runner`` picks one; ``compile`` means one thing everywhere: make the step's fast form before serving it (on
a CPU the one dynamic graph when the model is a float32 decoder, else a graph per bucket; on CUDA the recorded
graphs, or compiled ones for models the lean step does not fit). On CUDA ``compile=None`` (the default) records the
plain lean step, ``compile=True`` compiles it before recording, ``compile=False`` is the eager runner.
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.runners.eager import EagerRunner

KINDS = ("eager", "cpu", "compiled", "graphs")


def make_runner(model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                prefix_blocks: int = 0, pad_id: int = 0, compile: bool | None = None,
                kind: str | None = None, kv_cache: str | None = None) -> EagerRunner:
    """The runner for ``model`` on its device (``kind`` to choose one by name; see the module docstring);
    ``kv_cache="fp16"``: keys and values kept as half floats (the CPU and eager runners)."""
    from lmforge.generation.lean import fits
    from lmforge.generation.runners.compiled import CompiledRunner
    from lmforge.generation.runners.cpu import CpuRunner, fits_one_graph
    from lmforge.generation.runners.graphs import GraphRunner

    if kind is not None and kind not in KINDS:
        raise LmforgeError(f"runner: {kind!r} is not one of {', '.join(KINDS)}")
    device = next(model.parameters()).device.type
    if kind is None:
        if device == "cpu":
            kind = "compiled" if compile and not fits_one_graph(model) else "cpu"
        elif compile if compile is not None else device == "cuda":
            kind = "graphs" if device == "cuda" and fits(model) else "compiled"
        else:
            kind = "eager"
    if kv_cache not in (None, "fp16"):
        raise LmforgeError(f"kv_cache: {kv_cache!r} is not one of fp16 (or none: the model's own float type)")
    if kv_cache and (kind not in ("cpu", "eager") or (kind == "cpu" and compile)):
        raise LmforgeError(f"kv_cache fp16: for the CPU and eager runners (this one is {kind}"
                           f"{', compiled' if compile else ''}); leave it out")
    args = (model, slots, capacity, memory, start_id, prefix_blocks, pad_id)
    if kind == "graphs":
        return GraphRunner(*args, compile_step=compile is True)
    if kind == "compiled":
        return CompiledRunner(*args)
    kv_dtype = torch.float16 if kv_cache else None
    return CpuRunner(*args, compile=bool(compile), kv_dtype=kv_dtype) if kind == "cpu" else \
        EagerRunner(*args, kv_dtype=kv_dtype)
