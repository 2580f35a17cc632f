"""Getting one update's batches to the device while the previous update still runs on it.

A GPU runs what the host queued, in order, while the host goes on. The host is ahead as long as it never
waits for a result; then building the next batch (Python, NumPy) and copying it costs nothing, since it
happens while the device computes. So the trainer asks for step s + 1's batches right after queuing
step s's backward pass:

    host    [queue step s] [build + copy batch s+1] [queue step s+1] [build + copy batch s+2] ...
    device           [   step s   ][  step s+1  ][  step s+2  ] ...

The copy is asynchronous (``non_blocking``) only from page-locked ("pinned") host memory, so on CUDA the
batch is pinned first. Everything the host must know about a batch (how many loss targets each
micro-batch holds, how many tokens it reads) is counted here, on the host copy, before it leaves:
reading those numbers back from the device later would make the host wait.

The source must give the same batch for the same (step, micro, rank, world_size) whenever it is asked
(the resume contract of ``BatchSource``): building a batch early then changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from lmforge.train.metrics import count_targets, count_tokens


class BatchSource(Protocol):
    """Where batches come from (``lmforge.data`` implements it; see docs/training.md for the contract)."""

    def batch(self, step: int, micro: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]: ...

    def eval_batches(self) -> Iterable[dict[str, torch.Tensor]]: ...


@dataclass
class StepBatches:
    """The ``grad_accum`` micro-batches of one update on this process, already on (their way to) the device.

    micro: the micro-batches, each a dict of tensors on the device.
    counts: (k + 1,) float64 on the device: n_1 .. n_k, the loss targets of each micro-batch, then the
        input tokens this process reads in the update (for tokens/s); exact integers.
    empty: host copy of ``n_i == 0`` per micro-batch (a mean over no targets is 0/0: the trainer skips it).
    """

    step: int
    micro: list[dict[str, torch.Tensor]]
    counts: torch.Tensor
    empty: list[bool]

    @property
    def targets(self) -> torch.Tensor:
        return self.counts[:-1]  # (k,)

    @property
    def tokens(self) -> torch.Tensor:
        return self.counts[-1]  # ()


class Prefetcher:
    """Builds, counts and copies the micro-batches of a step; ``prefetch(s)`` starts early, ``get(s)`` takes them.

    >>> class Source:
    ...     def batch(self, step, micro, rank=0, world_size=1):
    ...         return {"input_ids": torch.full((2, 3), step), "labels": torch.tensor([[1, 2, -100], [3, -100, -100]])}
    >>> batches = Prefetcher(Source(), grad_accum=2, rank=0, world_size=1, device=torch.device("cpu"))
    >>> b = batches.get(1)
    >>> b.targets.tolist(), b.empty, b.tokens.item()
    ([3.0, 3.0], [False, False], 12.0)
    """

    def __init__(self, source: BatchSource, grad_accum: int, rank: int, world_size: int, device: torch.device,
                 shift: int = 0) -> None:
        self.source, self.grad_accum, self.rank, self.world_size = source, grad_accum, rank, world_size
        self.device, self.shift = device, shift
        self.pin = device.type == "cuda"
        self.ready: StepBatches | None = None

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if self.pin:
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def build(self, step: int) -> StepBatches:
        """Ask the source for step ``step``'s micro-batches, count them on the host, start their copies."""
        host = [self.source.batch(step, m, self.rank, self.world_size) for m in range(self.grad_accum)]
        n = torch.stack([count_targets(b, self.shift) for b in host]).double()  # (k,) host
        counts = torch.cat([n, torch.tensor([float(sum(count_tokens(b) for b in host))], dtype=torch.float64)])
        micro = [{k: self._to_device(v) for k, v in b.items()} for b in host]
        return StepBatches(step=step, micro=micro, counts=self._to_device(counts), empty=(n == 0).tolist())

    def prefetch(self, step: int) -> None:
        self.ready = self.build(step)

    def get(self, step: int) -> StepBatches:
        """Step ``step``'s batches: the prefetched ones if they are that step's, else built now."""
        ready, self.ready = self.ready, None
        return ready if ready is not None and ready.step == step else self.build(step)
