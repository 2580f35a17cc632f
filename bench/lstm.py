"""lmforge.nn.LSTM vs torch.nn.LSTM: a training step (forward + backward) of the same stacked BiLSTM.

    .venv/bin/python bench/lstm.py                    # 2-layer BiLSTM, 512 -> 2 x 256, batch 32, 64 steps
    .venv/bin/python bench/lstm.py --padded           # rows of different lengths (packed sequences)
    .venv/bin/python bench/lstm.py --explicit         # lmforge's step-by-step path instead of the fused one

Both modules hold the same weights (copied across) and see the same batch; they are timed in alternating
rounds with the process CPU clock (steadier than the wall clock on a shared machine), best round kept.
The outputs are compared before timing. lmforge's fast path calls PyTorch's fused LSTM kernel one layer and
one direction at a time (ELMo needs every layer's output; a backward direction runs on reversed rows), so
the ratio measures what that bookkeeping costs.
"""

from __future__ import annotations

import argparse
import time

import torch

from lmforge.nn.lstm import LSTM


def copy_weights(ours: LSTM, theirs: torch.nn.LSTM) -> None:
    with torch.no_grad():
        for layer in range(ours.num_layers):
            for d in range(ours.dirs):
                cell = ours.cells[layer * ours.dirs + d]
                suffix = f"_l{layer}" + ("_reverse" if d else "")
                getattr(theirs, "weight_ih" + suffix).copy_(cell.weight_ih)
                getattr(theirs, "weight_hh" + suffix).copy_(cell.weight_hh)
                getattr(theirs, "bias_ih" + suffix).copy_(cell.bias)
                getattr(theirs, "bias_hh" + suffix).zero_()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=64, help="sequence length")
    p.add_argument("--input", type=int, default=512)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--padded", action="store_true", help="random lengths in [T/4, T]")
    p.add_argument("--explicit", action="store_true", help="time lmforge's step-by-step path")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ours = LSTM(args.input, args.hidden, args.layers, bidirectional=True)
    theirs = torch.nn.LSTM(args.input, args.hidden, args.layers, bidirectional=True, batch_first=True)
    copy_weights(ours, theirs)
    x = torch.randn(args.batch, args.steps, args.input)
    lengths = torch.full((args.batch,), args.steps)
    if args.padded:
        lengths = torch.randint(args.steps // 4, args.steps + 1, (args.batch,))
    mask = torch.arange(args.steps)[None, :] < lengths[:, None]

    def run_ours() -> torch.Tensor:
        return ours(x, mask if args.padded else None, explicit=args.explicit).output

    def run_theirs() -> torch.Tensor:
        if not args.padded:
            return theirs(x)[0]
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, _ = torch.nn.utils.rnn.pad_packed_sequence(theirs(packed)[0], batch_first=True,
                                                         total_length=args.steps)
        return out

    diff = (run_ours() - run_theirs()).abs().max().item()
    times: dict[str, list[float]] = {"lmforge": [], "torch.nn.LSTM": []}
    for r in range(args.rounds + 1):
        for name, fn, module in (("lmforge", run_ours, ours), ("torch.nn.LSTM", run_theirs, theirs)):
            start = time.process_time()
            for _ in range(3):
                fn().sum().backward()
                module.zero_grad(set_to_none=True)
            if r:  # round 0 warms up
                times[name].append((time.process_time() - start) / 3)
    best = {k: min(v) for k, v in times.items()}
    path = "explicit" if args.explicit else "fused"
    print(f"BiLSTM {args.layers} layers, {args.input} -> 2 x {args.hidden}, batch {args.batch}, T {args.steps}"
          f"{', padded' if args.padded else ''}; lmforge {path} path; max |difference| {diff:.2e}")
    for name, t in best.items():
        print(f"  {name:14s} {t * 1000:8.1f} ms CPU per forward + backward")
    print(f"  speed ratio lmforge / torch: {best['torch.nn.LSTM'] / best['lmforge']:.2f}x")


if __name__ == "__main__":
    main()
