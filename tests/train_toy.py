"""A tiny self-contained language model and batch source for the trainer's tests, and a script.

As a script it trains the toy into --out and prints the final loss as JSON; the tests run it in a
subprocess (SIGKILL and resume) and under torchrun (2 processes on gloo):

    python tests/train_toy.py --out runs/toy --steps 8 --save-every 3
    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/train_toy.py --out runs/ddp ...
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.errors import LmforgeError, Stopped
from lmforge.train import TrainConfig, train
from lmforge.train import distributed as D

VOCAB = 32


@dataclass
class ToyOutput:  # a dataclass, like lmforge's ModelOutput: FSDP finds the tensors inside it
    loss: torch.Tensor | None
    logits: torch.Tensor


class ToyLM(nn.Module):
    """Embedding -> dropout -> MLP -> LayerNorm -> tied output: per-position next-token scores."""

    def __init__(self, d: int = 16, dropout: float = 0.1) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.drop = nn.Dropout(dropout)
        self.fc = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.head.weight = self.emb.weight  # tied, as in GPT
        nn.init.normal_(self.emb.weight, std=0.1)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                poison: torch.Tensor | None = None) -> ToyOutput:
        h = self.drop(self.emb(input_ids))  # (B, T, D)
        h = self.norm(h + F.gelu(self.fc(h)))
        logits = self.head(h)  # (B, T, V)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
            if poison is not None and bool(poison.any()):
                loss = loss * float("nan")
        return ToyOutput(loss, logits)


class ToySource:
    """Deterministic batches: row g of (step, micro) depends only on (seed, step, micro, g).

    Rows of a micro-batch are numbered across processes: rank r of W holds global rows
    [r*b, (r+1)*b) of micro-batch ``micro`` (whose W*b rows are numbered from micro * W*b), so that
    2 processes x b rows = 1 process x 2b rows, and k micro-batches x b = 1 micro-batch x k*b.
    Labels end in a random amount of -100 padding, so micro-batches hold different numbers of targets.
    """

    def __init__(self, batch_size: int, seq_len: int = 12, seed: int = 0, poison_step: int | None = None):
        self.batch_size, self.seq_len, self.seed, self.poison_step = batch_size, seq_len, seed, poison_step

    def _row(self, step: int, g: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step * 10_007 + g)
        ids = torch.randint(0, VOCAB, (self.seq_len,), generator=gen)
        labels = (ids * 7 + 3) % VOCAB  # a learnable mapping
        pad = int(torch.randint(0, self.seq_len // 2, (1,), generator=gen))
        if pad:
            labels[-pad:] = -100
        return ids, labels

    def batch(self, step: int, micro: int, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        b = self.batch_size
        first = micro * world_size * b + rank * b
        rows = [self._row(step, g) for g in range(first, first + b)]
        out = {"input_ids": torch.stack([r[0] for r in rows]), "labels": torch.stack([r[1] for r in rows])}
        if self.poison_step is not None:
            out["poison"] = torch.tensor(step == self.poison_step)
        return out

    def eval_batches(self):
        """A fixed validation set: 2 batches of 4 rows, whatever the training batch size."""
        return [ToySource(4, self.seq_len, self.seed).batch(-1 - i, 0) for i in range(2)]


def toy_decoder() -> nn.Module:
    """A one-layer modern lmforge Decoder on the toy vocabulary: a model Muon has matrices to train."""
    from lmforge.models import Decoder, get_preset

    return Decoder(get_preset("gpt-tiny", vocab_size=VOCAB, d_model=16, n_layers=1, n_heads=2, d_ff=32,
                              max_positions=16, dropout=0.0, attention_dropout=0.0, norm="rmsnorm",
                              positions="rotary", qk_norm=True, activation="relu2", tie_embeddings=False))


def main(argv: list[str] | None = None) -> int:
    import faults

    faults.install()  # LMFORGE_TEST_KILL_AT_STEP / LMFORGE_TEST_SIGNAL_AT_STEP, when a test sets them
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-every", type=int, default=3)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--fsdp-out", help="then train again with FSDP into this directory (same processes)")
    p.add_argument("--optimizer", default="adamw", help="adamw | muon (muon trains toy_decoder, not ToyLM)")
    p.add_argument("--dist-timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    runs = [(args.out, args.fsdp)] + ([(args.fsdp_out, True)] if args.fsdp_out else [])
    env = D.detect()
    created = D.init(env, torch.device("cpu"), args.dist_timeout)  # one process group for all runs
    try:
        for out, fsdp in runs:
            torch.manual_seed(0)
            model = toy_decoder() if args.optimizer == "muon" else ToyLM(dropout=args.dropout)
            config = TrainConfig(lr=1e-2, warmup_steps=2, max_steps=args.steps, batch_size=args.batch_size,
                                 grad_accum=args.grad_accum, save_every=args.save_every,
                                 eval_every=args.eval_every, log_every=1, keep_last=2, progress=False,
                                 plot=False, fsdp=fsdp, dist_timeout=args.dist_timeout,
                                 optimizer=args.optimizer)
            try:
                result = train(model, ToySource(args.batch_size), config, out)
            except LmforgeError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
            except Stopped as stop:  # SIGINT / SIGTERM: the step is checkpointed
                print(f"rank {env.rank}: {stop}", file=sys.stderr)
                return stop.exit_code
            if env.is_main:
                print(json.dumps({"loss": result.loss, "step": result.step, "resumed_from": result.resumed_from}))
    finally:
        D.shutdown(created)
    return 0


if __name__ == "__main__":
    sys.exit(main())
