"""``lmforge serve`` vs ``transformers serve`` (with and without continuous batching), same model, same machine,
one run; then a soak of ``lmforge serve``.

    .venv/bin/python bench/serve.py                         # SmolLM2-135M-Instruct, 1 / 4 / 16 clients
    .venv/bin/python bench/serve.py --skip-transformers --soak 2000
    .venv/bin/python bench/serve.py --prompts long --new 128                 # replies near 128 tokens
    python3 bench/serve.py --device cuda --dtype bf16 --servers lmforge lmforge-eager transformers-cb \
        --clients 1 4 16 64 --slots 64                                   # on a GPU (CUDA graphs, eager, CB)
    .venv/bin/python bench/serve.py --skip-transformers --clients 16 --prompts long --constrained 0.5  # JSON's cost

Each server runs as a subprocess on 127.0.0.1 with the same threads (``--threads``, OMP_NUM_THREADS). Clients are
the official ``openai`` client in threads: each sends ``--requests`` chat completions one after another (fixed
questions, greedy, up to ``--new`` tokens, streamed so that the time to first token is seen). Printed per server and
concurrency: aggregate completion tokens/s (from the ``usage`` the server reports), p50 / p99 time to first token
and to the last token, errors, the clients' own CPU use (CPU seconds a second: they share the machine), and for
lmforge its engine's steps in the load, their mean time and the engine's busy share (/metrics). transformers serves
the same model converted to a Hugging Face folder (``lmforge convert --to-hf``): the same weights, the same chat
template, the same greedy tokens.

``--constrained F``: each load runs twice on the same server, free, then with the first F of its clients asking for
``response_format`` (a JSON schema: ``{"answer": string}``, the string long enough to run to ``--new`` tokens);
the second row's ``constrained_clients`` says how many.

The soak sends ``--soak`` requests (random lengths; one in four abandoned after its first token) and reads the
server's resident memory after the first 10% and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests
from llama_pair import converted

ROOT = Path(__file__).resolve().parents[1]
# lmforge's sources first, then whatever the caller's PYTHONPATH already names (e.g. carried wheels)
PYTHONPATH = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
QUESTIONS = ["What is the capital of France?", "Name three primary colours.", "How many days are in a week?",
             "Write one sentence about the sea.", "What is two plus two?", "Say hello in Spanish.",
             "What do bees make?", "Name a planet of the solar system."]
# --prompts long: questions whose answers run to about --new tokens, so that decoding, not the prompt, is the work
SERVERS = {"lmforge": "lmforge serve", "lmforge-eager": "lmforge serve --no-compile",
           "transformers": "transformers serve --no-continuous-batching",
           "transformers-cb": "transformers serve --continuous-batching"}
ESSAYS = ["Write a short story about a cat who learns to fly.", "Explain how a rainbow forms, step by step.",
          "Describe a day in the life of a medieval farmer.", "Write a poem about autumn leaves.",
          "Explain to a child why the sky is blue.", "Give five tips for learning a new language.",
          "Describe the water cycle in detail.", "Write a letter to a friend about your summer holiday."]


def start(command: list[str], port: int, threads: int, log: Path) -> tuple[subprocess.Popen, float]:
    """The server started, and the seconds until it answered /v1/models (its start-up: import, load, warm-up)."""
    began = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": PYTHONPATH, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        try:
            if requests.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                return proc, time.monotonic() - began
        except requests.RequestException:
            pass
        if proc.poll() is not None:
            raise SystemExit(f"{command[0]} exited ({proc.returncode}); see {log}")
        time.sleep(0.25)
    proc.kill()
    raise SystemExit(f"{' '.join(command[:3])} did not answer within 10 minutes; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


# a JSON object whose string runs past --new tokens: constrained replies as long as free ones (--prompts long), so
# that tokens/s compares the steps, not the replies' lengths
ANSWER = {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": {
    "type": "object", "properties": {"answer": {"type": "string", "minLength": 2000}}, "required": ["answer"],
    "additionalProperties": False}}}


def one(client, model: str, question: str, new: int, constrained: bool = False) -> dict:
    """A streamed chat completion: (time to first token, total seconds, completion tokens) or the error;
    ``constrained``: its reply a JSON object (``ANSWER``)."""
    start = time.perf_counter()
    first, tokens = None, 0
    extra = {"response_format": ANSWER} if constrained else {}
    try:
        stream = client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                temperature=0, max_tokens=new, stream=True,
                                                stream_options={"include_usage": True}, **extra)
        for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as err:  # counted, not raised: a benchmark reports errors
        return {"error": f"{type(err).__name__}: {err}"}
    return {"ttft": first if first is not None else time.perf_counter() - start,
            "total": time.perf_counter() - start, "tokens": tokens}


def load(port: int, model: str, clients: int, per_client: int, new: int, questions: list[str],
         constrained: int = 0) -> dict:
    """``clients`` threads sending ``per_client`` requests each, the first ``constrained`` of them with a
    response_format; the aggregate numbers."""
    import openai

    results: list[dict] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=900)
        for i in range(per_client):
            r = one(client, model, questions[(k + i) % len(questions)], new, k < constrained)
            with lock:
                results.append(r)

    steps = engine_steps(port)
    start, cpu = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    ok = [r for r in results if "error" not in r]
    engine = {}
    if steps is not None:  # lmforge serve: its engine's steps in this load, their mean time, its busy share
        (n0, s0), (n1, s1) = steps, engine_steps(port)
        engine = {"engine_steps": n1 - n0, "engine_step_ms": round(1000 * (s1 - s0) / max(n1 - n0, 1), 1),
                  "engine_busy": round((s1 - s0) / wall, 3)}

    def pct(values: list[float], q: float) -> float:
        return round(statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else values[0], 3)

    return {"clients": clients, "constrained_clients": constrained, "requests": len(results),
            "errors": len(results) - len(ok),
            "tokens_per_s": round(sum(r["tokens"] for r in ok) / wall, 1),
            "ttft_p50_s": pct([r["ttft"] for r in ok], 50), "ttft_p99_s": pct([r["ttft"] for r in ok], 99),
            "total_p50_s": pct([r["total"] for r in ok], 50), "total_p99_s": pct([r["total"] for r in ok], 99),
            "first_error": next((r["error"] for r in results if "error" in r), None),
            "client_cpu_s_per_s": round(cpu / wall, 2), **engine}


def engine_steps(port: int) -> tuple[int, float] | None:
    """lmforge serve's engine counters from /metrics (steps, busy seconds); None from another server."""
    found = {}
    for line in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("lmforge_engine_steps_total", "lmforge_engine_busy_seconds_total"):
            found[name] = float(value)
    if len(found) < 2:
        return None
    return int(found["lmforge_engine_steps_total"]), found["lmforge_engine_busy_seconds_total"]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def soak(port: int, proc: subprocess.Popen, n: int) -> dict:
    """n requests, random lengths, one in four abandoned mid-stream; resident memory after 10% and at the end."""
    rng = random.Random(0)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    before = None
    errors = 0
    for i in range(n):
        body = {"messages": [{"role": "user", "content": rng.choice(QUESTIONS)}], "temperature": 0,
                "max_tokens": rng.randint(1, 12), "stream": True}
        with requests.post(url, json=body, stream=True, timeout=300) as r:
            errors += r.status_code != 200
            for k, _ in enumerate(r.iter_lines()):
                if rng.random() < 0.25 and k >= 1:
                    break  # hang up
        if i == n // 10:
            time.sleep(1)
            before = rss_mb(proc.pid)
    time.sleep(2)
    after = rss_mb(proc.pid)
    health = requests.get(f"http://127.0.0.1:{port}/health", timeout=30).json()
    return {"requests": n, "errors": errors, "rss_after_warmup_mb": round(before, 1), "rss_end_mb": round(after, 1),
            "growth_percent": round(100 * (after - before) / before, 2), "slots_in_use_at_end": health["slots_in_use"],
            "waiting_at_end": health["waiting"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--requests", type=int, default=1, help="requests per client")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--soak", type=int, default=0, help="requests of the soak run (0: none)")
    p.add_argument("--port", type=int, default=8710)
    p.add_argument("--prompts", choices=["short", "long"], default="short",
                   help="short questions (replies of 8-40 tokens) or long ones (replies near --new)")
    p.add_argument("--device", default="cpu", help="cpu | cuda (both servers)")
    p.add_argument("--dtype", choices=["fp32", "bf16", "int8", "int4"], default="fp32",
                   help="both servers' weights (int8, int4: lmforge's quantized layers, with --skip-transformers)")
    p.add_argument("--context", type=int, help="lmforge serve --context (fewer compiled graphs on a GPU)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="the 'lmforge' server's --compile / --no-compile (default: lmforge's own: CUDA graphs on "
                        "CUDA)")
    p.add_argument("--servers", nargs="+", choices=SERVERS, default=["lmforge", "transformers", "transformers-cb"],
                   help="which servers, in this order (lmforge-eager: lmforge serve --no-compile)")
    p.add_argument("--slots", type=int, default=16, help="lmforge serve --slots")
    p.add_argument("--budget", type=float, default=0, help="seconds of load a server may take: the client counts "
                   "left when it is spent are skipped with a row saying so (0: no limit)")
    p.add_argument("--out", help="also append every row here (JSON lines)")
    p.add_argument("--lmforge-args", default="", help="more options for the lmforge servers (one string)")
    p.add_argument("--logs", help="a folder for the servers' logs (default: the work folder, removed at the end)")
    p.add_argument("--constrained", type=float, default=0.0,
                   help="also run each load with this share of its clients asking for a JSON schema (lmforge)")
    p.add_argument("--keep", action="store_true", help="keep the work folder (two model copies, ~1 GB)")
    args = p.parse_args()
    if args.skip_transformers:
        args.servers = [s for s in args.servers if not s.startswith("transformers")]
    if args.dtype in ("int8", "int4") and any(s.startswith("transformers") for s in args.servers):
        p.error(f"--dtype {args.dtype}: lmforge's quantized layers only; add --skip-transformers")
    with converted("lmforge-serve-bench-", args.keep, env={**os.environ, "PYTHONPATH": PYTHONPATH}) as work:
        run(args, work)


def commands(args: argparse.Namespace, work: Path) -> dict[str, list[str]]:
    """Each server's command line, by name."""
    lmforge = [sys.executable, "-m", "lmforge.cli", "serve", "--model", str(work / "lmforge"), "--slots",
               str(args.slots), "--threads", str(args.threads), "--port", str(args.port), "--device", args.device,
               "--dtype", args.dtype, *(["--context", str(args.context)] if args.context else []),
               *args.lmforge_args.split()]
    switch = [] if args.compile is None else ["--compile" if args.compile else "--no-compile"]
    hf = [str(Path(sys.executable).parent / "transformers"), "serve", str(work / "hf"), "--device", args.device,
          "--dtype", {"fp32": "float32", "bf16": "bfloat16"}.get(args.dtype, args.dtype), "--port", str(args.port)]
    if not Path(hf[0]).exists():  # an environment whose scripts are elsewhere (a --target install)
        hf[0:1] = [sys.executable, "-m", "transformers.cli.transformers"]
    return {"lmforge": [*lmforge, *switch], "lmforge-eager": [*lmforge, "--no-compile"],
            "transformers": [*hf, "--no-continuous-batching"], "transformers-cb": [*hf, "--continuous-batching"]}


def run(args: argparse.Namespace, work: Path) -> None:
    compiled = args.device.startswith("cuda") if args.compile is None else args.compile  # as lmforge serve resolves it
    questions = ESSAYS if args.prompts == "long" else QUESTIONS
    for name in args.servers:
        command = commands(args, work)[name]
        log = Path(args.logs or work) / f"{name}.log"
        try:
            proc, startup = start(command, args.port, args.threads, log)
        except SystemExit as err:  # this server is reported; the others still run
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.exists() else []
            emit({"bench": "serve", "server": SERVERS[name], "error": f"{err}: {' | '.join(tail)}"}, args.out)
            continue
        listed = requests.get(f"http://127.0.0.1:{args.port}/v1/models", timeout=30).json()["data"]
        model = listed[0]["id"] if listed else str(work / "hf")  # transformers serve lists its hub cache only
        began = time.monotonic()
        try:
            load(args.port, model, 1, 1, 4, QUESTIONS)  # warm-up
            if args.constrained and name == "lmforge":  # and the grammar engine's tokenizer, made once
                load(args.port, model, 1, 1, 4, QUESTIONS, 1)
            shares = [0.0, args.constrained] if args.constrained and name == "lmforge" else [0.0]
            for clients in args.clients:
                for share in shares:
                    row = {"bench": "serve", "server": SERVERS[name], "threads": args.threads,
                           "new_tokens": args.new, "device": args.device, "dtype": args.dtype,
                           "slots": args.slots if name.startswith("lm") else None,
                           "compile": compiled if name == "lmforge" else False, "prompts": args.prompts,
                           "startup_s": round(startup, 1), "constrained_share": share}
                    if args.budget and time.monotonic() - began > args.budget:
                        row.update(clients=clients, skipped=f"the server's {args.budget:.0f} s of load were spent")
                    else:
                        row.update(load(args.port, model, clients, args.requests, args.new, questions,
                                        round(share * clients)))
                    emit(row, args.out)
            if args.soak and name == "lmforge":
                emit({"bench": "serve-soak", **soak(args.port, proc, args.soak)}, args.out)
        finally:
            stop(proc)


def emit(row: dict, out: str | None) -> None:
    print(json.dumps(row), flush=True)
    if out:
        with Path(out).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
