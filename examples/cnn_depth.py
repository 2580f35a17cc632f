"""Seed 001 problem 3(c): the sentence CNN's cost per layer, and its parallel depth against an RNN's.

Exercise (paraphrased). With every computation done in parallel as soon as its inputs exist, what is
the parallel run time of the stride-2 CNN as a function of T and L? Compare an RNN.

Answer. Layer ℓ+1 needs only layer ℓ, and each of its ⌈T/2^(ℓ+1)⌉ · D outputs is one independent sum of
K · D products: O(1) steps for O(1)-sized parameters (O(log KD) for a summation tree). The depth is O(L),
and L = ⌈log2 T⌉ layers are enough for the top position to see the whole sentence, so O(log T). The total
work halves with every layer (2 · B · T_ℓ+1 · K · D² FLOPs), summing to less than twice the first layer's.
An RNN computes h_t from h_t-1: T dependent steps, O(T), or O(T + L) for L stacked layers (a wavefront).

main() measures, on one CPU thread, the CPU time and FLOPs of every layer for one batch, and compares the
whole CNN with a T-step tanh RNN of the same width. Times depend on the machine; the FLOP counts do not.

    python examples/cnn_depth.py                  # B = 8, T = 1024, D = 256, K = 3, L = 10
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from lmforge.models.cnn import CNNConfig, SentenceCNN, forward_flops, halved_lengths


def best_time(fn, repeats: int = 5) -> float:
    """Median CPU seconds of ``fn()`` over ``repeats`` runs, after one warm-up run.

    CPU time of the (single-threaded) process, not wall time: on a machine shared with other jobs the
    wall clock measures the neighbours too.
    """
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


@torch.no_grad()
def layer_costs(batch: int = 8, length: int = 1024, d_model: int = 256, kernel_width: int = 3,
                n_layers: int | None = None) -> list[dict[str, float]]:
    """One row per convolution layer: T in, T out, FLOPs, measured seconds and GFLOP/s."""
    n_layers = n_layers or math.ceil(math.log2(length))
    config = CNNConfig(vocab_size=1000, d_model=d_model, n_layers=n_layers, kernel_width=kernel_width, dropout=0.0)
    model = SentenceCNN(config).eval()
    ids = torch.randint(0, 1000, (batch, length))
    h = model.embed(ids)  # (B, T, D)
    mask = torch.ones(batch, length, dtype=torch.bool)
    rows = []
    lengths = halved_lengths(length, n_layers)
    for i, (layer, flops) in enumerate(zip(model.layers, forward_flops(config, batch, length), strict=True)):
        seconds = best_time(lambda layer=layer, h=h, mask=mask: layer(h, mask))
        rows.append({"layer": i + 1, "t_in": lengths[i], "t_out": lengths[i + 1], "flops": flops,
                     "seconds": seconds, "gflops_per_s": flops / seconds / 1e9})
        h, mask = layer(h, mask)
    return rows


@torch.no_grad()
def cnn_vs_rnn(batch: int = 8, d_model: int = 256, lengths: tuple[int, ...] = (64, 256, 1024)) -> list[dict]:
    """Seconds for the whole CNN (L = log2 T layers: L dependent steps) and a tanh RNN (T dependent steps)."""
    cell = torch.nn.RNNCell(d_model, d_model)
    rows = []
    for t in lengths:
        n_layers = math.ceil(math.log2(t))
        model = SentenceCNN(CNNConfig(vocab_size=1000, d_model=d_model, n_layers=n_layers, dropout=0.0)).eval()
        ids = torch.randint(0, 1000, (batch, t))
        x = model.embed(ids)  # (B, T, D)

        def rnn(x=x) -> torch.Tensor:
            h = torch.zeros(batch, d_model)
            for step in range(x.shape[1]):  # h_t = tanh(W x_t + U h_t-1 + b): waits for h_t-1
                h = cell(x[:, step], h)
            return h

        cnn_flops = sum(forward_flops(model.config, batch, t))
        rnn_flops = 2 * batch * t * 2 * d_model * d_model
        rows.append({"T": t, "cnn_steps": n_layers, "rnn_steps": t, "cnn_flops": cnn_flops, "rnn_flops": rnn_flops,
                     "cnn_s": best_time(lambda ids=ids, model=model: model(ids), 3),
                     "rnn_s": best_time(rnn, 3)})
    return rows


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("| layer | T in | T out | MFLOP | ms | GFLOP/s |")
    print("|---|---|---|---|---|---|")
    for r in layer_costs():
        print(f"| {r['layer']} | {r['t_in']} | {r['t_out']} | {r['flops'] / 1e6:,.1f} | {r['seconds'] * 1e3:.3f} "
              f"| {r['gflops_per_s']:.1f} |")
    print()
    print("| T | CNN layers (dependent steps) | RNN steps | CNN MFLOP | RNN MFLOP | CNN ms | RNN ms |")
    print("|---|---|---|---|---|---|---|")
    for r in cnn_vs_rnn():
        print(f"| {r['T']} | {r['cnn_steps']} | {r['rnn_steps']} | {r['cnn_flops'] / 1e6:,.0f} "
              f"| {r['rnn_flops'] / 1e6:,.0f} | {r['cnn_s'] * 1e3:.2f} | {r['rnn_s'] * 1e3:.2f} |")


if __name__ == "__main__":
    main()
