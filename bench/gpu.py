"""lmforge vs transformers on one GPU, in one process: training steps, decoding, and ``lmforge pretrain`` end to end.

    .venv/bin/python bench/gpu.py                      # the issue-17 table on CUDA (about 10 minutes on an H100)
    .venv/bin/python bench/gpu.py --smoke              # every code path at tiny shapes, on CPU (or --device cuda)
    .venv/bin/python bench/gpu.py --only decode --only pretrain

Rows (GPT-2 124M shape: 12 layers, d 768, 12 heads, FFN 3072, context 1024; bf16 autocast):
    GPT train step      fwd + bwd + fused AdamW, vocab 50304, batch 16 x 1024: eager, then torch.compile
    BERT-base MLM step  fwd + bwd + fused AdamW, vocab 30522, batch 32 x 512, 15% of positions labelled
    greedy decoding     prompt 16, 256 new tokens, batch 1 and 16, bf16 weights: lmforge eager, recorded (the
                        lean step as CUDA graphs, ``compile=None``) and compiled (the step through torch.compile,
                        then recorded, ``compile=True``), transformers' default ``generate`` and, where the
                        installed version has it, its static cache (which ``generate`` compiles); recorded and
                        compiled == eager tokens checked on fp32 copies (bf16 near-ties are not mismatches)
    engine              1, 4, 16 concurrent requests arriving one per step (prompt 30, 128 new, greedy): the
                        engine's aggregate tokens/s and time to first token vs transformers batched and serial
    lmforge pretrain    the whole job (data, Trainer, checkpoints) on Shakespeare characters (byte-level, 257
                        symbols padded to 320), batch 16 x 1024, no biases, bf16 and compile by default on CUDA;
                        tokens/s as the trainer logs them, after the compiling steps. The peer: nanoGPT's train.py
                        on the same job in the same run (``--nanogpt DIR``: its three files, bench/nanogpt_peer.py);
                        without it, its figure of issue 17 (618k tokens/s on an H100).

MFU = model FLOPs per second / the bf16 matmul peak measured in this run (an 8192^3 matmul; the spec sheet's
dense bf16 peak is printed beside it); model FLOPs per token are 6 N + 12 L T d for training and 2 N + 4 L t d for
decoding (N: weights used in matmuls; bench/models.py). Training models pad their vocabulary to a multiple of 64.

Every row is printed and appended to ``--out`` (JSON lines) as soon as it finishes; a row that fails is written
with its error and the others still run. The machine needs no network: ``--text FILE`` is the Shakespeare text
for the pretrain row (put it in the working tree first); without it the row says it is skipped.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from models import Sizes, alternate, bert_pair, gpt_pair, matmul_peak, matmul_weights, mlm_batch, sync, train_step_fn

from lmforge.generation.lm import LM

warnings.filterwarnings("ignore")


@dataclass
class Shapes:
    gpt: Sizes
    bert: Sizes
    gpt_batch: int = 16
    gpt_seq: int = 1024
    bert_batch: int = 32
    bert_seq: int = 512
    prompt: int = 16
    new_tokens: int = 256
    decode_batches: tuple[int, ...] = (1, 16)
    concurrency: tuple[int, ...] = (1, 4, 16)
    pretrain_steps: int = 60
    pretrain_log: int = 10


FULL = Shapes(gpt=Sizes(vocab=50304, d=768, layers=12, heads=12, ff=3072),
              bert=Sizes(vocab=30522, d=768, layers=12, heads=12, ff=3072))
SMOKE = Shapes(gpt=Sizes(vocab=512, d=64, layers=2, heads=2, ff=256), bert=Sizes(vocab=512, d=64, layers=2, heads=2,
               ff=256), gpt_batch=2, gpt_seq=64, bert_batch=2, bert_seq=64, prompt=4, new_tokens=12,
               decode_batches=(1, 2), concurrency=(1, 2), pretrain_steps=6, pretrain_log=2)


def train_rows(shapes: Shapes, device: torch.device, amp: torch.dtype | None, args, peak: float) -> Iterator[dict]:
    for name, pair, s, batch, seq in (
        ("GPT train step", lambda: gpt_pair(shapes.gpt, shapes.gpt_seq, dropout=0.0), shapes.gpt, shapes.gpt_batch,
         shapes.gpt_seq),
        ("BERT-base MLM step", lambda: bert_pair(shapes.bert, shapes.bert_seq), shapes.bert, shapes.bert_batch,
         shapes.bert_seq),
    ):
        mlm = name.startswith("BERT")
        if mlm:
            ids, labels = mlm_batch(s, batch, seq, device)
            labelled = (labels != -100).float().mean().item()
        else:
            ids = torch.randint(0, s.vocab, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
            labels, labelled = ids, 1.0
        flops = 6 * matmul_weights(s, mlm=mlm) + 12 * s.layers * seq * s.d
        flops -= 6 * (1 - labelled) * (s.d * s.d + s.vocab * s.d) if mlm else 0
        for compiled in (False, True):
            ours, hf = pair()
            if compiled:
                ours, hf = torch.compile(ours), torch.compile(hf)
            best = alternate({"lmforge": train_step_fn(ours, ids, labels, device, amp),
                              "transformers": train_step_fn(hf, ids, labels, device, amp)},
                             args.warmup, args.rounds, args.steps, device)
            label = f"{name}{', compiled' if compiled else ', eager'} (batch {batch} x {seq})"
            del ours, hf
            empty_cache(device)
            yield row(label, batch * seq / best["lmforge"], batch * seq / best["transformers"], flops, peak)


def decode_rows(shapes: Shapes, device: torch.device, dtype: torch.dtype, args, peak: float) -> Iterator[dict]:
    s, prompt, new = shapes.gpt, shapes.prompt, shapes.new_tokens
    ours, hf = gpt_pair(s, prompt + new, dropout=0.0)
    exact = ours.to(device, torch.float32).eval()  # fp32: compiled == eager is checked here, no bf16 near-ties
    ours, hf = copy.deepcopy(exact).to(dtype), hf.to(device, dtype).eval()
    flops = 2 * matmul_weights(s) + 4 * s.layers * (prompt + new / 2) * s.d
    ways = {"lmforge recorded": None, "lmforge compiled": True, "lmforge eager": False}  # generate's compile=
    for batch in shapes.decode_batches:
        ids = torch.randint(0, s.vocab, (batch, prompt), generator=torch.Generator().manual_seed(batch)).to(device)
        eager = tokens(lmforge_decode(exact, ids, new, False)())
        agree = {name: (tokens(lmforge_decode(exact, ids, new, way)()) == eager).float().mean().item()
                 for name, way in ways.items() if way is None or batch == shapes.decode_batches[0]}  # a compile less
        fns = {name: lmforge_decode(ours, ids, new, way) for name, way in ways.items()}
        fns["transformers"] = hf_decode(hf, ids, new)
        if static_cache_available() and not args.no_static:
            fns["transformers static+compile"] = hf_decode(hf, ids, new, cache_implementation="static")
        for fn in fns.values():
            fn()  # compiles what compiles and records the CUDA graphs, outside the timed rounds
        best = alternate(fns, 1, args.gen_rounds, 1, device)
        tok_s = {name: batch * new / t for name, t in best.items()}
        peer = max(v for k, v in tok_s.items() if k.startswith("transformers"))
        for name in ways:
            r = row(f"greedy decoding, {name} (batch {batch}, prompt {prompt}, {new} new)", tok_s[name], peer,
                    flops, peak)
            r["peers"] = {k: round(v, 1) for k, v in tok_s.items() if k.startswith("transformers")}
            r["same_tokens_as_eager"] = agree.get(name, 1.0 if name == "lmforge eager" else None)
            yield r
    del ours, hf, exact
    empty_cache(device)


def engine_rows(shapes: Shapes, device: torch.device, dtype: torch.dtype, smoke: bool) -> Iterator[dict]:
    """bench/engine.py's concurrency rows at the GPT-2 124M shape (bf16 weights on the GPU); every timing is the
    second of two runs of the same work (the first compiles, records CUDA graphs, fills transformers' caches)."""
    from engine import hf_generate, lmforge_concurrent

    s = shapes.gpt
    ours, hf = gpt_pair(s, 1024, dropout=0.0)
    ours, hf = ours.to(device, dtype).eval(), hf.to(device, dtype).eval()
    new, prompt = (12, 8) if smoke else (128, 30)
    g = torch.Generator().manual_seed(0)
    lone = [torch.randint(10, s.vocab, (prompt,), generator=g).tolist()]
    one = min(hf_generate(hf, lone, new, "static", device) for _ in range(2))
    for c in shapes.concurrency:
        work = [torch.randint(10, s.vocab, (prompt,), generator=g).tolist() for _ in range(c)]
        got = lmforge_concurrent(ours, work, new, compile=device.type == "cuda", repeat=2)
        batched = min(hf_generate(hf, work, new, "static", device) for _ in range(2))
        yield ({"row": f"engine, {c} concurrent (prompt {prompt}, {new} new, arriving one per step)",
                     "lmforge": got["tokens_per_s"], "peer": max(c * new / batched, new / one),
                     "ratio": got["tokens_per_s"] / max(c * new / batched, new / one), "mfu": float("nan"),
                     "ttft_p50_s": statistics.median(got["ttft"]), "ttft_max_s": max(got["ttft"]),
                     "peers": {"hf batched": c * new / batched, "hf serial": new / one}})
    del ours, hf
    empty_cache(device)


def lmforge_decode(model, ids: torch.Tensor, new: int, compile: bool | None):
    """A call of an ``LM`` held across calls, as chat, evaluate and serve hold one: its engine (and graphs) made at
    the first call, reused by the next (``generate()`` makes an engine for each call)."""
    runner = "graphs" if compile is not False else "eager"  # CUDA's choices, named so that --smoke runs them on CPU
    lm, prompts = LM(model, compile=compile, runner=runner), ids.tolist()
    return lambda: lm.generate(prompts, max_new_tokens=new, stop_ids=[])


def tokens(generations: list) -> torch.Tensor:
    return torch.tensor([g.tokens for g in generations])


def hf_decode(model, ids: torch.Tensor, new: int, **extra):
    def run():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                  do_sample=False, pad_token_id=0, **extra)
    return run


def static_cache_available() -> bool:
    try:
        from transformers.generation.configuration_utils import STATIC_CACHE_IMPLEMENTATIONS
    except ImportError:
        return False
    return "static" in STATIC_CACHE_IMPLEMENTATIONS


def pretrain_row(shapes: Shapes, device: torch.device, text: str | None, peak: float, smoke: bool,
                 nanogpt: str | None = None) -> dict:
    """``lmforge pretrain`` on Shakespeare characters at the GPT-2 shape, tokens/s read from its own log; nanoGPT's
    train.py on the same job after it (``nanogpt``: the folder of its files)."""
    from lmforge.workflows.pretrain import pretrain

    s = shapes.gpt
    recipe = {
        "tokenizer": {"kind": "byte-bpe", "vocab_size": 257},  # one symbol per byte: characters
        # blank-line documents: a validation split even from a small --text
        "data": {"objective": "clm", "files": [text], "seq_len": shapes.gpt_seq, "val_fraction": 0.05,
                 "doc_separator": "blank-line", "eval_batches": 2},
        "model": {"preset": "gpt-tiny", "d_model": s.d, "n_layers": s.layers, "n_heads": s.heads,
                  "d_ff": s.ff, "max_positions": shapes.gpt_seq, "dropout": 0.0, "attention_dropout": 0.0,
                  "vocab_multiple": 64, "bias": False},  # nanoGPT's run: bias=False
        "train": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": min(10, shapes.pretrain_steps // 2),
                  "max_steps": shapes.pretrain_steps, "batch_size": shapes.gpt_batch, "betas": [0.9, 0.95],
                  "weight_decay": 0.1, "grad_clip": 1.0,
                  "log_every": shapes.pretrain_log, "save_every": 0, "eval_every": shapes.pretrain_steps,
                  "progress": False,
                  "plot": False, "tensorboard": False, "device": str(device)},
    }
    with tempfile.TemporaryDirectory() as out:
        result, _ = pretrain(recipe, out)
        events = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    speeds = [e["tokens_per_s"] for e in events if e.get("event") == "train"]
    steady = speeds[2:] if len(speeds) > 3 else speeds[-1:]  # the first intervals include compiling
    vocab = Sizes(vocab=257, d=s.d, layers=s.layers, heads=s.heads, ff=s.ff)
    flops = 6 * matmul_weights(vocab) + 12 * s.layers * shapes.gpt_seq * s.d
    peer, peer_name = (618_000.0 if not smoke else float("nan")), "nanoGPT (issue 17 figure)"
    extra = {}
    if nanogpt:
        from nanogpt_peer import nanogpt_tokens_per_s

        got = nanogpt_tokens_per_s(Path(nanogpt), Path(text).read_text(encoding="utf-8"), shapes.gpt_batch,
                                   shapes.gpt_seq, shapes.pretrain_steps, shapes.pretrain_log,
                                   skip=min(30, shapes.pretrain_steps // 2), device=str(device),
                                   compile=device.type == "cuda", shape=(s.layers, s.heads, s.d))
        peer, peer_name = got["tokens_per_s"], f"nanoGPT train.py {got['commit'][:8]}, same job, same run"
        extra = {"peer_intervals": got["intervals"], "peer_final_loss": got["final_loss"]}
    r = row(f"lmforge pretrain end to end, Shakespeare chars (batch {shapes.gpt_batch} x {shapes.gpt_seq})",
            statistics.median(steady), peer, flops, peak)
    r.update(extra, lmforge_intervals=[round(v) for v in speeds])
    r["peer_name"], r["final_loss"] = peer_name, round(result.loss, 4)
    r["eval_loss"] = (result.eval or {}).get("eval_loss")
    return r


def guarded(name: str, job: Callable[[], Iterable[dict]]) -> Iterator[dict]:
    """The job's rows as each finishes (a stop mid-job keeps those written); an error becomes one more row."""
    try:
        yield from job()
    except Exception as err:  # one failing row is reported; the others still run
        yield {"row": name, "error": f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"}


def row(name: str, ours: float, peer: float, flops_per_token: float, peak: float) -> dict:
    return {"row": name, "lmforge": ours, "peer": peer, "ratio": ours / peer, "mfu": ours * flops_per_token / peak}


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


SPEC_BF16 = {"H100": 989e12, "H200": 989e12, "A100": 312e12, "L4": 121e12}  # dense bf16 TFLOP/s, spec sheets


def spec_peak(device: torch.device) -> float | None:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return next((v for k, v in SPEC_BF16.items() if k in name), None)


def versions(device: torch.device) -> str:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return (f"{name}; torch {torch.__version__}; transformers {transformers.__version__}; "
            f"python {platform.python_version()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 1 round: checks every path runs (CPU is fine)")
    p.add_argument("--only", choices=["train", "decode", "engine", "pretrain"], action="append",
                   help="run only these")
    p.add_argument("--text", help="the Shakespeare text for the pretrain row (no network: nothing is fetched)")
    p.add_argument("--nanogpt", help="a folder holding nanoGPT's model.py, train.py, configurator.py: the pretrain "
                   "row's peer, run on the same job after lmforge (bench/nanogpt_peer.py)")
    p.add_argument("--pretrain-steps", type=int, help="steps of each pretrain run (default 60; 120 with --nanogpt)")
    p.add_argument("--new-tokens", type=int, help="new tokens of the decoding rows (default 256)")
    p.add_argument("--gen-rounds", type=int, help="timed rounds of the decoding rows (default 3)")
    p.add_argument("--no-static", action="store_true", help="decoding rows without transformers' static cache + "
                   "compile (its compiling takes minutes)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu.jsonl"),
                   help="append each row here as JSON lines as soon as it finishes")
    p.add_argument("--decode-batches", type=int, nargs="+", help="batch sizes of the decoding rows (default 1 16)")
    p.add_argument("--concurrency", type=int, nargs="+", help="concurrent requests of the engine rows (1 4 16)")
    args = p.parse_args()
    device = torch.device(args.device)
    smoke = args.smoke or device.type != "cuda"
    shapes = SMOKE if smoke else FULL
    if args.decode_batches:
        shapes = dataclasses.replace(shapes, decode_batches=tuple(args.decode_batches))
    if args.concurrency:
        shapes = dataclasses.replace(shapes, concurrency=tuple(args.concurrency))
    if args.new_tokens:
        shapes = dataclasses.replace(shapes, new_tokens=args.new_tokens)
    if args.pretrain_steps or (args.nanogpt and not smoke):
        shapes = dataclasses.replace(shapes, pretrain_steps=args.pretrain_steps or 120)
    args.warmup, args.rounds, args.steps, rounds = (1, 2, 2, 1) if smoke else (3, 5, 5, 3)
    args.gen_rounds = args.gen_rounds or rounds
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    amp = torch.bfloat16 if cuda else None
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = matmul_peak(device, dtype, 8192 if not smoke else 512, 10 if not smoke else 2)
    spec = spec_peak(device)
    header = (f"{versions(device)}; matmul peak ({dtype}, measured) {peak / 1e12:.1f} TFLOP/s"
              + (f", spec sheet {spec / 1e12:.0f}" if spec else ""))
    print(header, file=sys.stderr, flush=True)
    order = args.only or ["train", "decode", "engine", "pretrain"]  # --only also sets the order
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jobs = {"train": lambda: train_rows(shapes, device, amp, args, peak),
            "decode": lambda: decode_rows(shapes, device, dtype, args, peak),
            "engine": lambda: engine_rows(shapes, device, dtype, smoke),
            "pretrain": lambda: [pretrain_row(shapes, device, args.text, peak, smoke, args.nanogpt)] if args.text else
            [{"row": "lmforge pretrain", "skipped": "no --text: pass the Shakespeare text (this machine fetches "
              "nothing)"}]}
    rows: list[dict] = []
    started = time.perf_counter()
    for name in dict.fromkeys(order):
        for r in guarded(name, jobs[name]):
            r.update(device=versions(device), measured_peak=peak, spec_peak=spec, smoke=smoke)
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(r, default=str) + "\n")
            print(json.dumps(r, default=str), flush=True)
            rows.append(r)
        sync(device)
    print(f"\n{header}; {time.perf_counter() - started:.0f} s{' (smoke shapes)' if smoke else ''}")
    print("| row | lmforge tokens/s | peer tokens/s | ratio | MFU lmforge |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        if "lmforge" in r:
            print(f"| {r['row']} | {r['lmforge']:,.0f} | {r['peer']:,.0f} | {r['ratio']:.2f}x | {r['mfu']:.1%} |")
        else:
            print(f"| {r['row']} | {r.get('error') or r.get('skipped')} | | | |")


if __name__ == "__main__":
    main()
