"""Beside another process's busy core: does a process given two threads run anything on the second one?

    .venv/bin/python bench/contention.py                       # int8, a spinner started and ended here
    .venv/bin/python bench/contention.py --dtype int4 --pairs 10
    .venv/bin/python bench/contention.py --no-spinner          # the same on a free machine
    .venv/bin/python bench/contention.py --smoke               # 8 tokens, 2 pairs: checks the bench itself

What a user meets is ``bench/cpu_decode.py``'s whole processes (2 threads / 1 paired by round). Their rounds
move 0.7-1.5x with where the host places two processes beside a busy core, so this bench looks inside one
process instead, beside a spinning child process of its own (``python -c "while True: pass"``, ended by its
PID however the bench ends):

1. *load*: ``lmforge.load`` of SmolLM2's GGUF at 2 threads, then at 1 (torch's count set around each), in
   alternation, seconds each;
2. *workers*: an engine of 2 threads decodes 128 tokens; the voluntary and involuntary context switches and CPU
   ticks of each of the process's threads over the decode alone (``/proc/self/task/*``): OpenMP workers with 0
   switches never woke, so every step ran on the main thread;
3. *pairs*: one engine decoding at 2 threads (torch's count, its thread policy) and at 1 (torch's count 1, no
   policy: as an engine made at one thread runs), in alternation, the order flipped each pair: decode tokens/s
   and the median 2 / 1 ratio. One engine, not two: two engines made one after the other decode a few percent
   apart with the same settings (int4, both at one thread: the second made 1.5-3% faster, 4 runs of 8 pairs),
   more than what is measured here.

The thread policy (generation/runners/threads.py) and ``lmforge.cores`` are what is measured; the rows go to
standard output as JSON lines, then a summary.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

import lmforge
from lmforge.data.sources import smollm2_path
from lmforge.generation.engine import Request
from lmforge.generation.lm import LM
from lmforge.workflows.chat import chat_format

QUESTION = "What is the capital of France? Answer in one sentence."


def threads_now() -> dict[str, tuple[int, int, int]]:
    """Each thread of this process: (voluntary switches, involuntary switches, CPU ticks)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
            stat = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a thread that ended meanwhile
            continue
        out[task.name] = (int(status["voluntary_ctxt_switches"]), int(status["nonvoluntary_ctxt_switches"]),
                          int(stat[11]) + int(stat[12]))
    return out


def decode(lm: LM, ids: list[int], new: int) -> tuple[float, dict[str, tuple[int, ...]]]:
    """Decode tokens/s of one request (after its prompt) and each thread's switches and ticks over the decode."""
    request, began, before = Request(ids, max_new_tokens=new, stop_ids=[]), None, {}
    for _ in lm.steps([request]):
        if began is None:
            before, began = threads_now(), time.perf_counter()
    took, after = time.perf_counter() - began, threads_now()
    moved = {name: tuple(b - a for a, b in zip(before.get(name, (0, 0, 0)), now, strict=True))
             for name, now in after.items()}
    return (new - 1) / took, moved


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtype", choices=["fp32", "int8", "int4"], default="int8")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--loads", type=int, default=3)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct's Q4_1 from PyPI)")
    p.add_argument("--no-spinner", action="store_true", help="measure on the machine as it is")
    p.add_argument("--smoke", action="store_true", help="8 tokens, 2 pairs, 1 load each way")
    args = p.parse_args()
    if args.smoke:
        args.new, args.pairs, args.loads = 8, 2, 1
    path = str(args.model or smollm2_path())
    dtype = {} if args.dtype == "fp32" else {"dtype": args.dtype}
    torch.set_num_threads(2)
    spinner = None if args.no_spinner else subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        loads: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.loads):
            for threads in (2, 1):
                torch.set_num_threads(threads)
                began = time.perf_counter()
                model, tokenizer = lmforge.load(path, **dtype)
                loads[threads].append(time.perf_counter() - began)
                print(json.dumps({"load": threads, "seconds": round(loads[threads][-1], 3)}), flush=True)
        ids = chat_format(path, tokenizer, model).prompt_ids([{"role": "user", "content": QUESTION}])
        torch.set_num_threads(2)
        lm = LM(model.eval(), tokenizer, slots=1)
        lm.run([Request(ids, max_new_tokens=2, stop_ids=[])])  # its weights packed, its policy made
        runner = lm.engine.runner
        policy = runner.threads
        rate, moved = decode(lm, ids, args.new)
        main_thread = str(threading.main_thread().native_id)  # as /proc/self/task names it
        workers = {name: m for name, m in moved.items() if name != main_thread}
        print(json.dumps({"workers": workers, "main": moved.get(main_thread), "decode_tok_s": round(rate, 1)}),
              flush=True)
        rates: dict[int, list[float]] = {1: [], 2: []}
        for pair in range(args.pairs):  # one engine, its buffers and weights the same: only the threads differ
            woke = 0
            for threads in ((2, 1) if pair % 2 == 0 else (1, 2)):
                torch.set_num_threads(threads)
                runner.threads = policy if threads == 2 else None  # as an engine made at one thread has it
                rate, moved = decode(lm, ids, args.new)
                rates[threads].append(rate)
                woke += sum(m[0] + m[1] for name, m in moved.items() if name != main_thread) if threads == 2 else 0
            print(json.dumps({"pair": pair, "2": round(rates[2][-1], 1), "1": round(rates[1][-1], 1),
                              "workers_woke": woke, "probes": policy.decisions if policy else None}), flush=True)
    finally:
        if spinner is not None:
            spinner.kill()
            spinner.wait()
    ratios = [a / b for a, b in zip(rates[2], rates[1], strict=True)]
    woke = sum(m[0] + m[1] for m in workers.values())
    print(f"\n{args.dtype}, {'beside a spinner' if spinner else 'free machine'}: load 2 threads "
          f"{statistics.median(loads[2]):.2f} s, 1 thread {statistics.median(loads[1]):.2f} s; while the 2-thread "
          f"engine decoded, its {len(workers)} other threads switched {woke} times; decode 2 threads / 1 "
          f"{statistics.median(ratios):.3f}x (pairs: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
