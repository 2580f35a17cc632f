"""The quantized products of one decoding step, lmforge's kernels (nn/kernels.c) against torch's weight-only
kernels (``_weight_int8pack_mm`` / ``_weight_int4pack_mm_for_cpu``), the same integers in each layout.

    .venv/bin/python bench/kernels.py                       # int8 and int4, 1 and 2 threads, 1, 2 and 16 rows
    .venv/bin/python bench/kernels.py --kinds int4 --rows 1 --threads 1

One pass = the 120 products of SmolLM2-135M's 30 layers (in_proj 960 x 576, out_proj 576 x 576, fc1 3072 x 576,
fc2 576 x 1536) and its 49152 x 576 head (int8, as ``quantize`` makes it), each layer with its own random weights,
so that, as in decoding, a product's weights come from memory, not from the cache the previous pass left. The
layouts alternate pass by pass; medians of ``--passes`` passes after 3 warm ones.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lmforge.nn import kernels
from lmforge.nn.quant import QuantizedLinear, quantize_int4, quantize_int8

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # (out, in) of a SmolLM2 layer's products
LAYERS, VOCAB = 30, 49152


def layers(kind: str) -> tuple[list[QuantizedLinear], list[QuantizedLinear]]:
    """The step's products in kernels.c's layout and in torch's, from the same integers."""
    built = kernels.library
    ours, theirs = [], []
    g = torch.Generator().manual_seed(0)
    for n, k in [s for _ in range(LAYERS) for s in SHAPES] + [(VOCAB, 576)]:
        w = torch.randn(n, k, generator=g) * 0.05
        head = n == VOCAB
        parts = quantize_int8(w) if kind == "int8" or head else quantize_int4(w)
        for target, library in ((ours, built), (theirs, lambda: None)):
            kernels.library = library
            try:
                target.append(QuantizedLinear.int8(*parts) if kind == "int8" or head else QuantizedLinear.int4(*parts))
            finally:
                kernels.library = built
    return ours, theirs


def one_pass(products: list[QuantizedLinear], inputs: dict[int, torch.Tensor], library) -> float:
    built = kernels.library
    kernels.library = library
    try:
        start = time.perf_counter()
        for layer in products:
            layer(inputs[layer.in_features])
        return time.perf_counter() - start
    finally:
        kernels.library = built


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", nargs="+", default=["int8", "int4"], choices=["int8", "int4"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rows", nargs="+", type=int, default=[1, 2, 16])
    p.add_argument("--passes", type=int, default=15)
    args = p.parse_args()
    if kernels.library() is None:
        raise SystemExit("kernels.c could not be built here: nothing to compare")
    built = kernels.library
    print("| kind | threads | rows | kernels.c ms | torch ms | torch / kernels.c |\n|---|---:|---:|---:|---:|---:|")
    for kind in args.kinds:
        ours, theirs = layers(kind)
        for threads in args.threads:
            torch.set_num_threads(threads)
            for rows in args.rows:
                g = torch.Generator().manual_seed(1)
                inputs = {k: torch.randn(rows, k, generator=g) for k in (576, 1536)}
                times: dict[str, list[float]] = {"ours": [], "theirs": []}
                for i in range(args.passes + 3):
                    for name, products, library in (("ours", ours, built), ("theirs", theirs, lambda: None)):
                        took = one_pass(products, inputs, library)
                        if i >= 3:
                            times[name].append(took)
                a, b = (statistics.median(times[n]) * 1e3 for n in ("ours", "theirs"))
                print(f"| {kind} | {threads} | {rows} | {a:.2f} | {b:.2f} | {b / a:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
