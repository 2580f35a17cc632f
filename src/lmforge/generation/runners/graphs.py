"""The graph runner: the lean decoding step (generation/lean.py) recorded once as a CUDA graph and replayed.

On a GPU a small model's step is bound by the host: the lean step launches about 18 kernels a layer, each a few
microseconds of Python and dispatch for a kernel that runs in one. A CUDA graph records those launches once and
replays them in one call, so the host's share of a step becomes one ``replay``. Recording needs everything the
step reads at fixed addresses and every shape fixed:

    inputs    the tokens and lengths of the rows, (2, S) on the device, written before each replay by one
              non-blocking copy from pinned memory (``upload``: no host sync)
    caches    the slots' keys and values, allocated once (slots.py), never moved
    shapes    every step computes all S slots (a free slot's row is padding at column 0), reading the first C_b
              columns of the caches: one graph per column bucket (256, 512, ... the capacity); a prefill takes
              one prompt, right-padded to a width bucket (16, 32, ... the capacity): one graph per width
    outputs   the logits of each graph, at a fixed address, read before the next replay

Stepping all slots costs little on a GPU (a small model's step reads its weights once however many rows there
are) and keeps a row's bits independent of its neighbours: the products always have S rows, so the same kernels
run whatever mix of requests is held, and a request's tokens alone equal its tokens beside others. Prefills take
one prompt at a time for the same reason (a prompt's bits never depend on another's), each the model's own
forward recorded once per width: eager, a prefill of SmolLM2 is ~2,000 launches (~20 ms of host work), and at 64
clients the arrivals' prefills, one after another, held up every step. The host's only wait is the chosen tokens
(``choose``'s one read). At warm-up each recorded prefill is replayed once and compared with the eager call it
was recorded from: a mismatch (a model whose forward cannot be recorded) leaves prefills eager, with a line
saying so.

Compiled (``compile_step``, what ``compile=True`` asks for on CUDA): the lean step goes through ``torch.compile``
before it is recorded. Recording removes the host's launches but not the kernels: a GPT-2-shaped layer is about 24
small kernels of ~2.5 µs each, far more than its weights take to read at batch 1. Inductor fuses the pointwise work
between the products (the norm with the residual sum, bias with activation, the scale, bias and softmax of the
scores, the cache write), so the graph replays fewer kernels (SmolLM2: 455 a step against 732, the step 1.4x
faster on an H200; docs/benchmarks.md). Compiling takes tens of seconds per column width at the first start
(Inductor keeps what it built in its cache on disk, so a restart reuses it); the default (``compile=None``) records
the plain step and starts in seconds.

On a device without CUDA graphs (a CPU: the tests) a "graph" is the same step called again on the same static
buffers, so that everything but the recording itself runs and is tested everywhere.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.lean import LeanStep, fits
from lmforge.generation.runners.eager import EagerRunner
from lmforge.generation.slots import bucket, buckets, upload


class Replay:
    """What a CUDA graph does, as plain calls: ``replay()`` runs ``fn`` on the static inputs again; ``output`` is
    the last result (a device without CUDA graphs)."""

    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        self.fn = fn
        self.output = fn()

    def replay(self) -> None:
        self.output = self.fn()


class Recorded:
    """``fn`` recorded as a CUDA graph: run twice on a side stream (kernels chosen, workspaces made), recorded in
    the runner's memory pool (graphs share it: they never run at once), replayed by ``replay``."""

    def __init__(self, fn: Callable[[], torch.Tensor], pool: tuple | None) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.output = fn()  # (S, V), at a fixed address: each replay writes it again

    def replay(self) -> None:
        self.graph.replay()


class GraphRunner(EagerRunner):
    """The eager runner whose decoding step is the lean step, recorded once per column bucket, and whose prefill is
    the model's forward, recorded once per prompt width (module docstring)."""

    name = "graphs"

    def __init__(self, model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                 prefix_blocks: int = 0, pad_id: int = 0, compile_step: bool = False) -> None:
        super().__init__(model, slots, capacity, memory, start_id, 0, pad_id)  # no prefix cache: one path a prompt
        if not fits(model, self.caches):
            raise LmforgeError("runner: the graph runner records the lean step of a decoder (generation/lean.py); "
                               "this model steps through its forward (use the compiled runner)")
        self.lean = LeanStep(model, self.caches)
        # the function each step graph records: the lean step, or its torch.compile'd form (module docstring)
        self.step_fn = torch.compile(self.lean, fullgraph=True) if compile_step else self.lean
        rows = self.row_buckets[-1]
        self.inputs = torch.zeros(2, rows, dtype=torch.long, device=self.device)  # (2, S): tokens, lengths
        self.inputs[0] = pad_id
        self.prompt = torch.full((capacity,), pad_id, dtype=torch.long, device=self.device)  # (C,) a prefill's ids
        self.at = torch.zeros(2, dtype=torch.long, device=self.device)  # a prefill's slot and last real position
        self.graphs: dict[tuple[str, int], Replay | Recorded] = {}  # ("step", columns) | ("prefill", width)
        self.recorded = 0  # graphs recorded since the runner was made (warm-up's, and any a call had to make)
        self.seconds = 0.0  # time spent recording them
        self.prefill_graphs = True  # False once a recorded prefill disagreed with its eager call (warmup)
        self.pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None

    def rows_for(self, slots: int) -> list[int]:
        """Every step computes all the slots (see the module docstring)."""
        return [slots]

    def columns_for(self, capacity: int, longest_prompt: int) -> tuple[list[int], list[int]]:
        """Columns in powers of two from 256, prompt widths in powers of two from 16 (a graph each)."""
        return buckets(min(256, capacity), capacity), buckets(min(16, longest_prompt), longest_prompt)

    def groups(self, arrivals):
        """One prompt a prefill (a row's bits then never depend on another prompt's)."""
        return [(0, [a]) for a in arrivals]

    def prefill(self, slots: list[int], prompts: list[Sequence[int]], start: int = 0) -> torch.Tensor:
        """One prompt into its slot: its ids and (slot, last position) copied into the graph's inputs, the graph of
        its width replayed; the next-token logits (1, V)."""
        if start or len(prompts) != 1 or not self.prefill_graphs:
            return super().prefill(slots, prompts, start)
        (i,), (ids,) = slots, prompts
        width = bucket(len(ids), self.prompt_buckets)
        upload([*ids, *[self.pad_id] * (width - len(ids))], self.device, out=self.prompt[:width])
        upload([i, len(ids) - 1], self.device, out=self.at)
        graph = self.graph("prefill", width)
        graph.replay()
        return graph.output

    def step(self, tokens: list[int], lengths: list[int], sources: list[int],
             rows: list[int] | None = None) -> torch.Tensor:
        """Rows [0, R) of the slots, computed as all S: their tokens and lengths copied into the graph's inputs
        (the other rows padding), the graph of the columns they need replayed; logits (R, V). ``rows``: chosen
        slots one by one (a failed step retried), stepped eagerly through the model's forward."""
        if rows is not None:
            return super().step(tokens, lengths, sources, rows)
        n, pad = len(lengths), self.row_buckets[-1] - len(lengths)
        upload([tokens + [self.pad_id] * pad, lengths + [0] * pad], self.device, out=self.inputs)
        graph = self.graph("step", bucket(max(lengths) + 1, self.capacity_buckets))
        graph.replay()
        return graph.output[:n]

    def graph(self, kind: str, size: int) -> Replay | Recorded:
        """The recorded step reading ``size`` columns, or prefill of ``size`` prompt tokens; recorded now if
        warm-up did not (counted in ``recorded``: a server warms up, so that no request waits for a recording)."""
        if (kind, size) not in self.graphs:
            began = time.perf_counter()
            fn = functools.partial(self.lean_step if kind == "step" else self.prefill_call, size)
            with torch.inference_mode():
                self.graphs[kind, size] = Recorded(fn, self.pool) if self.device.type == "cuda" else Replay(fn)
            self.recorded += 1
            self.seconds += time.perf_counter() - began
        return self.graphs[kind, size]

    def lean_step(self, columns: int) -> torch.Tensor:
        """The step a graph records: the lean step of every slot over ``columns`` columns -> logits (S, V); each
        row's adapter read from the slots' (S,) at each replay."""
        with self.adapters(slice(0, self.inputs.shape[1])):
            return self.step_fn(self.inputs[0], self.inputs[1], columns)

    def prefill_call(self, width: int) -> torch.Tensor:
        """The prefill a graph records: the prompt (1, width) into slot ``at[0]``, the logits after ``at[1]``; its
        adapter that of slot ``at[0]``, gathered at each replay."""
        layers = self.caches.prefill(self.at[:1])
        with self.adapters(self.at[:1]):
            return self.call_prefill(layers, self.prompt[None, :width], self.at[1:])  # (1, V)

    def warmup(self) -> int:
        """Record every prefill width and every step width before the first request (on padding into slot 0,
        whose caches are zeroed again after); the number of graphs. Each recorded prefill's replay is compared
        with the eager prefill it was recorded from: a mismatch leaves prefills eager (said on stderr)."""
        with torch.inference_mode():
            self.inputs[0], self.inputs[1] = self.pad_id, 0
            for width in self.prompt_buckets:
                self.prompt[:width] = self.pad_id
                self.at[0], self.at[1] = 0, width - 1  # slot 0, the last of ``width`` pad tokens
                graph = self.graph("prefill", width)
                eager = super().prefill([0], [[self.pad_id] * width]).float()
                graph.replay()
                if not torch.allclose(graph.output.float(), eager, rtol=1e-2, atol=1e-2):
                    self.prefill_graphs = False
                    print(f"lmforge: a recorded prefill of {width} tokens disagrees with the eager one: prefills "
                          f"stay eager", file=sys.stderr)
                    break
            for columns in self.capacity_buckets:
                self.graph("step", columns)
            self.caches.clear()  # as new: unwritten columns hold 0
        return len(self.graphs)

    def describe(self) -> str:
        kind = "CUDA graphs" if self.device.type == "cuda" else "replayed calls (no CUDA graphs on this device)"
        compiled = " (the step compiled by torch.compile)" if self.step_fn is not self.lean else ""
        return super().describe() + (f"; {len(self.capacity_buckets)} step and {len(self.prompt_buckets)} prefill "
                                     f"{kind}, one per width{compiled}")
