"""The compiled runner: the eager runner's two calls compiled once per bucket (CUDA graphs on a GPU).

Each call is compiled with ``fullgraph=True`` (a graph break is an error) and ``dynamic=False``: one prefill graph
per prompt bucket, one step graph per (row bucket, column bucket), and per source bucket for an encoder-decoder.
Buckets are coarse (powers of two: 4, 8, 16 rows; 64, 128, ... columns) to bound the number of graphs, and
nothing else varies between calls: positions, lengths and the sampling settings are tensors, the caches never
move (their addresses are static, which CUDA graphs need). ``warmup`` compiles every graph before the first
request. A prefill takes one prompt at a time (one graph per width, and a lone row has nothing to differ from).
"""

from __future__ import annotations

import torch
from torch import nn

from lmforge.generation.runners.eager import EagerRunner
from lmforge.generation.slots import MIN_ROWS, buckets


class CompiledRunner(EagerRunner):
    """The eager runner, its prefill and step compiled per bucket (see the module docstring)."""

    name = "compiled"

    def __init__(self, model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                 prefix_blocks: int = 0, pad_id: int = 0) -> None:
        super().__init__(model, slots, capacity, memory, start_id, 0, pad_id)  # no prefix cache: a graph per start
        graphs = len(self.row_buckets) * len(self.capacity_buckets) + len(self.prompt_buckets)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs + 2)
        if self.device.type == "cuda":  # CUDA graphs read the caches where they are
            for kv in self.caches.all():
                torch._dynamo.mark_static_address(kv.k)
                torch._dynamo.mark_static_address(kv.v)
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self.prefill_fn, self.step_fn = (torch.compile(fn, fullgraph=True, dynamic=False, mode=mode)
                                         for fn in (self.prefill_fn, self.step_fn))

    def rows_for(self, slots: int) -> list[int]:
        """One row for one slot; otherwise powers of two from MIN_ROWS (a graph each)."""
        return [1] if slots == 1 else buckets(MIN_ROWS, max(slots, MIN_ROWS))

    def columns_for(self, capacity: int, longest_prompt: int) -> tuple[list[int], list[int]]:
        return buckets(min(64, capacity), capacity), buckets(min(16, capacity), longest_prompt)

    def groups(self, arrivals):
        return [(0, [a]) for a in arrivals]

    def warmup(self) -> int:
        """Compile every graph this runner can need, before any request waits for one: a prefill per prompt
        bucket, a step per (row bucket, column bucket) (and per source bucket for an encoder-decoder), on pad
        tokens in idle slots, which are zeroed again after. The number of graphs."""
        calls = 0
        sources = self.prompt_buckets if self.seq2seq else [1]
        with torch.inference_mode():
            for width in self.prompt_buckets:
                self.prefill([0], [[self.pad_id] * width])
                calls += 1
            for rows in self.row_buckets:
                for columns in self.capacity_buckets:
                    for source in sources:
                        self.step([self.pad_id] * rows, [columns - 1] * rows, [source] * rows)
                        calls += 1
            self.caches.clear()  # as new: unwritten columns hold 0
            self.src_mask.zero_()
        return calls

    def describe(self) -> str:
        graphs = len(self.row_buckets) * len(self.capacity_buckets) * (len(self.prompt_buckets) if self.seq2seq
                                                                       else 1) + len(self.prompt_buckets)
        return super().describe() + f"; {graphs} graphs (one per bucket)"
