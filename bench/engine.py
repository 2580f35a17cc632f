"""lmforge's decoding engine (continuous batching) vs transformers ``generate``, same model, same threads, one run.

    .venv/bin/python bench/engine.py                          # SmolLM2-135M's shape, random weights, 2 threads
    .venv/bin/python bench/engine.py --model $(.venv/bin/python -m lmforge.data.sources path smollm2)
    .venv/bin/python bench/engine.py --before /tmp/before/src # + a lone request on the previous generate()

(a) 1, 4 and 16 concurrent requests (prompt 30 tokens, 128 new tokens, greedy, no early stop), arriving one per
    engine step: aggregate new tokens per second and time to first token (TTFT), for
      lmforge     one Engine of 16 slots: requests join between steps (continuous batching)
      hf batched  one transformers generate call over the c prompts (static cache): the batch waits for its last
                  arrival and its longest output, and streams nothing (TTFT = the batch's prefill + first token)
      hf serial   transformers generate per request, one after another (static cache, and the default cache;
                  the faster is used): the i-th request waits for the i before it (TTFT = i * T + its own)
(b) the compile count of a mixed workload (prompt lengths, output lengths, batch sizes, sampling settings) with
    ``compile=True`` against the buckets the workload touched (a small GPT: compiling costs minutes per graph
    at 30 layers on 2 cores, and the count does not depend on the size).
(c) with ``--before SRC``: one request alone through ``generate`` now (a one-slot engine) and through the
    ``generate`` of SRC (an older checkout), on GPT-2 124M's shape (the older code has no grouped-query attention).

Rows are printed as a table and appended to bench/results/engine.jsonl as they finish.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama_pair import hf_twin, lmforge_model

from lmforge.generation.engine import Engine, Request

RESULTS = Path(__file__).parent / "results" / "engine.jsonl"


def record(row: dict) -> None:
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)


def prompts(n: int, length: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(10, vocab, (length,), generator=g).tolist() for _ in range(n)]


def lmforge_concurrent(model, work: list[list[int]], new: int, compile: bool = False, repeat: int = 1) -> dict:
    """Requests arrive one per engine step; returns aggregate tokens/s and TTFT (s) of each, from the last of
    ``repeat`` timed passes over the same engine (on a GPU the first pass still records CUDA graphs)."""
    engine = Engine(model, slots=16, capacity=512, compile=compile)
    for n in (1, 4, 16) if compile else ():  # compile the row buckets outside the timing
        for _ in range(n):
            engine.submit(Request(work[0], max_new_tokens=3, stop_ids=[]))
        engine.run()
    engine.submit(Request(work[0][:8], max_new_tokens=2, stop_ids=[]))  # warm-up
    engine.run()
    for _ in range(repeat - 1):
        timed_pass(engine, model, work, new)
    return timed_pass(engine, model, work, new)


def timed_pass(engine: Engine, model, work: list[list[int]], new: int) -> dict:
    arrived, first = {}, {}
    start = time.perf_counter()
    pending = list(enumerate(work))
    handles = []
    while pending or not engine.idle():
        if pending:
            i, ids = pending.pop(0)
            arrived[i] = time.perf_counter()
            handles.append(engine.submit(Request(ids, max_new_tokens=new, stop_ids=[],
                                                 on_token=lambda _t, i=i: first.setdefault(i, time.perf_counter()))))
        engine.step()
    if str(next(model.parameters()).device).startswith("cuda"):
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    assert all(len(h.tokens) == new for h in handles)
    return {"tokens_per_s": len(work) * new / wall, "ttft": [first[i] - arrived[i] for i in sorted(first)]}


def hf_generate(hf, batch: list[list[int]], new: int, cache: str | None, device: torch.device | None = None) -> float:
    ids = torch.tensor(batch, device=device)
    extra = {"cache_implementation": cache} if cache else {}
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                    do_sample=False, pad_token_id=0, **extra)
    if ids.device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="SmolLM2 GGUF file or model directory (default: its shape, random weights)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new", type=int, default=128, help="new tokens per request")
    p.add_argument("--prompt", type=int, default=30, help="prompt tokens")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--before", help="src/ of an older lmforge checkout: (c) compares a lone request with it")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model, what = lmforge_model(args.model)
    hf = hf_twin(model)
    vocab = model.config.vocab_size
    base = {"bench": "engine", "model": what, "threads": args.threads, "new_tokens": args.new,
            "prompt_tokens": args.prompt, "torch": torch.__version__}
    # (a) transformers per request: its time for one request, then serial service
    one = prompts(1, args.prompt, vocab)
    hf_generate(hf, [one[0][:8]], 2, "static")  # warm-up
    serial = {cache or "default": hf_generate(hf, one, args.new, cache) for cache in ("static", None)}
    ttft_one = min(hf_generate(hf, one, 1, cache) for cache in ("static", None))
    t_one = min(serial.values())
    for c in args.concurrency:
        work = prompts(c, args.prompt, vocab)
        ours = lmforge_concurrent(model, work, args.new)
        batched = hf_generate(hf, work, args.new, "static")
        batched_ttft = hf_generate(hf, work, 1, "static")
        serial_ttft = [i * t_one + ttft_one for i in range(c)]
        record({**base, "row": "concurrent", "concurrency": c,
                "lmforge_tokens_per_s": round(ours["tokens_per_s"], 1),
                "hf_batched_tokens_per_s": round(c * args.new / batched, 1),
                "hf_serial_tokens_per_s": round(args.new / t_one, 1), "hf_serial_seconds_by_cache": serial,
                "lmforge_ttft_p50_s": round(statistics.median(ours["ttft"]), 3),
                "lmforge_ttft_max_s": round(max(ours["ttft"]), 3),
                "hf_batched_ttft_s": round(batched_ttft, 3),
                "hf_serial_ttft_p50_s": round(statistics.median(serial_ttft), 3),
                "hf_serial_ttft_max_s": round(max(serial_ttft), 3),
                "ratio_vs_best_hf": round(ours["tokens_per_s"] / max(c * args.new / batched, args.new / t_one), 2)})
    # (b) the compile count of a mixed workload
    record({**base, "row": "compile_count", **compile_count()})
    # (c) a lone request: generate() now vs an older checkout's
    if args.before:
        record({**base, "row": "lone_request", **lone_request(args.before, args.threads, args.new)})


def compile_count() -> dict:
    from torch._dynamo.utils import counters

    from lmforge.generation.slots import bucket
    from lmforge.models import Decoder, get_preset

    torch._dynamo.reset()
    model = Decoder(get_preset("gpt-tiny", vocab_size=512, dropout=0.0, attention_dropout=0.0, positions="rotary",
                               n_kv_heads=2, max_positions=1024)).eval()
    engine = Engine(model, slots=16, capacity=1024, runner="compiled")  # a graph per bucket (the GPU's runner)
    before = counters["stats"]["unique_graphs"]
    g = torch.Generator().manual_seed(1)
    used_prefill, used_step, requests = set(), set(), 0
    for wave in range(6):  # waves of 1..16 requests, prompts 3..200 tokens, outputs 5..300, mixed sampling
        n = [1, 3, 5, 9, 16, 2][wave]
        work = []
        for _ in range(n):
            length, out = int(torch.randint(3, 200, (1,), generator=g)), int(torch.randint(5, 300, (1,), generator=g))
            work.append(Request(list(range(3, 3 + length)), max_new_tokens=out, temperature=[0.0, 0.7][wave % 2],
                                top_k=[None, 40][wave % 3 == 1], seed=wave, stop_ids=[]))
            used_prefill.add(bucket(length, engine.runner.prompt_buckets))
            used_step |= {(bucket(n, engine.runner.row_buckets), bucket(length + t + 1, engine.runner.capacity_buckets))
                          for t in range(out - 1)}
        for r in work:
            engine.submit(r)
        engine.run()
        requests += n
    graphs = counters["stats"]["unique_graphs"] - before
    return {"requests": requests, "graphs_compiled": graphs, "prefill_buckets_used": len(used_prefill),
            "step_buckets_used_at_most": len(used_step), "graph_breaks": sum(counters["graph_break"].values())}


LONE = """
import sys, time, torch
torch.set_num_threads({threads})
from lmforge.generation import generate
from lmforge.models import Decoder, get_preset
torch.manual_seed(0)
model = Decoder(get_preset("gpt2", dropout=0.0, attention_dropout=0.0)).eval()
ids = torch.randint(10, 50000, (1, 30))
generate(model, ids, max_new_tokens=4, stop_ids=[])

def once():
    start = time.perf_counter()
    generate(model, ids, max_new_tokens={new}, stop_ids=[])
    return time.perf_counter() - start

print(min(once() for _ in range(3)))
"""


def lone_request(before: str, threads: int, new: int) -> dict:
    """Seconds for one prompt of 30 tokens + ``new`` greedy tokens, GPT-2 124M shape, the best of 3, alternating."""
    code = LONE.format(threads=threads, new=new)
    times: dict[str, list[float]] = {"now": [], "before": []}
    for _ in range(2):
        for name, src in (("now", str(Path(__file__).parents[1] / "src")), ("before", before)):
            env = {**os.environ, "PYTHONPATH": src}
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            times[name].append(float(out.stdout.strip().splitlines()[-1]))
    now, old = min(times["now"]), min(times["before"])
    return {"now_s": round(now, 3), "before_s": round(old, 3), "now_over_before": round(now / old, 3)}


if __name__ == "__main__":
    main()
