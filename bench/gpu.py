"""lmforge vs transformers on one GPU, in one process: training steps, decoding, and ``lmforge pretrain`` end to end.

    .venv/bin/python bench/gpu.py                      # the issue-17 table on CUDA (about 10 minutes on an H100)
    .venv/bin/python bench/gpu.py --smoke              # every code path at tiny shapes, on CPU (or --device cuda)
    .venv/bin/python bench/gpu.py --only decode --only pretrain

Rows (GPT-2 124M shape: 12 layers, d 768, 12 heads, FFN 3072, context 1024; bf16 autocast):
    GPT train step      fwd + bwd + fused AdamW, vocab 50304, batch 16 x 1024: eager, then torch.compile
    BERT-base MLM step  fwd + bwd + fused AdamW, vocab 30522, batch 32 x 512, 15% of positions labelled
    greedy decoding     prompt 16, 256 new tokens, batch 1 and 16, bf16 weights: lmforge eager and compiled
                        (CUDA graphs), transformers' default ``generate`` and, where the installed version has
                        it, its static cache (which ``generate`` compiles)
    lmforge pretrain    the whole job (data, Trainer, checkpoints) on Shakespeare characters (byte-level, 257
                        symbols), batch 16 x 1024, bf16 and compile by default on CUDA; tokens/s as the trainer logs
                        them, after the compiling steps. nanoGPT's figure for the same job, 618k tokens/s on an
                        H100, is the bar (nanoGPT cannot be installed here).

MFU = model FLOPs per second / the bf16 matmul peak measured in this run (an 8192^3 matmul); model FLOPs per
token are 6 N + 12 L T d for training and 2 N + 4 L t d for decoding (N: weights used in matmuls; bench/models.py).
Offline machines: ``--text FILE`` trains on that file instead of fetching Shakespeare (LMFORGE_CACHE is read).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from models import Sizes, alternate, bert_pair, gpt_pair, matmul_peak, matmul_weights, mlm_batch, sync, train_step_fn

from lmforge.generation import generate

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
    pretrain_steps: int = 60
    pretrain_log: int = 10


FULL = Shapes(gpt=Sizes(vocab=50304, d=768, layers=12, heads=12, ff=3072),
              bert=Sizes(vocab=30522, d=768, layers=12, heads=12, ff=3072))
SMOKE = Shapes(gpt=Sizes(vocab=512, d=64, layers=2, heads=2, ff=256), bert=Sizes(vocab=512, d=64, layers=2, heads=2,
               ff=256), gpt_batch=2, gpt_seq=64, bert_batch=2, bert_seq=64, prompt=4, new_tokens=12,
               decode_batches=(1, 2), pretrain_steps=6, pretrain_log=2)


def train_rows(shapes: Shapes, device: torch.device, amp: torch.dtype | None, args, peak: float) -> list[dict]:
    rows = []
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
            rows.append(row(label, batch * seq / best["lmforge"], batch * seq / best["transformers"], flops, peak))
            del ours, hf
            empty_cache(device)
    return rows


def decode_rows(shapes: Shapes, device: torch.device, dtype: torch.dtype, args, peak: float) -> list[dict]:
    s, prompt, new = shapes.gpt, shapes.prompt, shapes.new_tokens
    ours, hf = gpt_pair(s, prompt + new, dropout=0.0)
    ours, hf = ours.to(device, dtype).eval(), hf.to(device, dtype).eval()
    flops = 2 * matmul_weights(s) + 4 * s.layers * (prompt + new / 2) * s.d
    rows = []
    for batch in shapes.decode_batches:
        ids = torch.randint(0, s.vocab, (batch, prompt), generator=torch.Generator().manual_seed(batch)).to(device)
        eager = lmforge_decode(ours, ids, new, False)().tokens
        fast = lmforge_decode(ours, ids, new, True)().tokens  # compiles (and records the CUDA graph)
        agree = (fast == eager).float().mean().item()
        fns = {"lmforge compiled": lmforge_decode(ours, ids, new, True),
               "lmforge eager": lmforge_decode(ours, ids, new, False), "transformers": hf_decode(hf, ids, new)}
        if static_cache_available():
            fns["transformers static+compile"] = hf_decode(hf, ids, new, cache_implementation="static")
        for fn in fns.values():
            fn()  # compiles what compiles, outside the timed rounds
        best = alternate(fns, 1, args.gen_rounds, 1, device)
        tok_s = {name: batch * new / t for name, t in best.items()}
        peer = max(v for k, v in tok_s.items() if k.startswith("transformers"))
        for name in ("lmforge compiled", "lmforge eager"):
            r = row(f"greedy decoding, {name} (batch {batch}, prompt {prompt}, {new} new)", tok_s[name], peer,
                    flops, peak)
            r["peers"] = {k: round(v, 1) for k, v in tok_s.items() if k.startswith("transformers")}
            r["same_tokens_as_eager"] = agree
            rows.append(r)
    del ours, hf
    empty_cache(device)
    return rows


def lmforge_decode(model, ids: torch.Tensor, new: int, compile: bool):
    return lambda: generate(model, ids, max_new_tokens=new, stop_ids=[], compile=compile)


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


def pretrain_row(shapes: Shapes, device: torch.device, text: str | None, peak: float, smoke: bool) -> dict:
    """``lmforge pretrain`` on Shakespeare characters at the GPT-2 shape, tokens/s read from its own log."""
    from lmforge.workflows.pretrain import pretrain

    s = shapes.gpt
    recipe = {
        "tokenizer": {"kind": "byte-bpe", "vocab_size": 257},  # one symbol per byte: characters
        "data": {"objective": "clm", "files": [text or "shakespeare"], "seq_len": shapes.gpt_seq,
                 "val_fraction": 0.01},
        "model": {"preset": "gpt-tiny", "d_model": s.d, "n_layers": s.layers, "n_heads": s.heads,
                  "d_ff": s.ff, "max_positions": shapes.gpt_seq, "dropout": 0.0, "attention_dropout": 0.0},
        "train": {"lr": 6e-4, "min_lr": 6e-5, "warmup_steps": min(10, shapes.pretrain_steps),
                  "max_steps": shapes.pretrain_steps, "batch_size": shapes.gpt_batch, "betas": [0.9, 0.95],
                  "weight_decay": 0.1, "grad_clip": 1.0,
                  "log_every": shapes.pretrain_log, "save_every": 0, "eval_every": 0, "progress": False,
                  "plot": False, "tensorboard": False, "device": str(device)},
    }
    with tempfile.TemporaryDirectory() as out:
        result, _ = pretrain(recipe, out)
        events = [json.loads(line) for line in (Path(out) / "log.jsonl").read_text().splitlines()]
    speeds = [e["tokens_per_s"] for e in events if e.get("event") == "train"]
    steady = speeds[2:] if len(speeds) > 3 else speeds[-1:]  # the first intervals include compiling
    vocab = Sizes(vocab=257, d=s.d, layers=s.layers, heads=s.heads, ff=s.ff)
    flops = 6 * matmul_weights(vocab) + 12 * s.layers * shapes.gpt_seq * s.d
    nanogpt = 618_000.0 if not smoke else float("nan")
    r = row(f"lmforge pretrain end to end, Shakespeare chars (batch {shapes.gpt_batch} x {shapes.gpt_seq})",
            statistics.median(steady), nanogpt, flops, peak)
    r["peer_name"], r["final_loss"] = "nanoGPT (issue 17 figure)", round(result.loss, 4)
    return r


def row(name: str, ours: float, peer: float, flops_per_token: float, peak: float) -> dict:
    return {"row": name, "lmforge": ours, "peer": peer, "ratio": ours / peer, "mfu": ours * flops_per_token / peak}


def empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def versions(device: torch.device) -> str:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return (f"{name}; torch {torch.__version__}; transformers {transformers.__version__}; "
            f"python {platform.python_version()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--smoke", action="store_true", help="tiny shapes, 1 round: checks every path runs (CPU is fine)")
    p.add_argument("--only", choices=["train", "decode", "pretrain"], action="append", help="run only these")
    p.add_argument("--text", help="train the pretrain row on this text file (default: fetch Shakespeare)")
    args = p.parse_args()
    device = torch.device(args.device)
    smoke = args.smoke or device.type != "cuda"
    shapes = SMOKE if smoke else FULL
    args.warmup, args.rounds, args.steps, args.gen_rounds = (1, 1, 1, 1) if smoke else (3, 5, 5, 3)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    amp = torch.bfloat16 if cuda else None
    dtype = torch.bfloat16 if cuda else torch.float32
    peak = matmul_peak(device, dtype, 8192 if not smoke else 512, 10 if not smoke else 2)
    print(f"device: {versions(device)}; matmul peak ({dtype}, measured): {peak / 1e12:.1f} TFLOP/s", file=sys.stderr)
    only = set(args.only or ["train", "decode", "pretrain"])
    rows: list[dict] = []
    started = time.perf_counter()
    if "train" in only:
        rows += train_rows(shapes, device, amp, args, peak)
    if "decode" in only:
        rows += decode_rows(shapes, device, dtype, args, peak)
    if "pretrain" in only:
        rows.append(pretrain_row(shapes, device, args.text, peak, smoke))
    sync(device)
    print(f"\n{versions(device)}; matmul peak {peak / 1e12:.1f} TFLOP/s ({dtype}); "
          f"{time.perf_counter() - started:.0f} s{' (smoke shapes)' if smoke else ''}")
    print("| row | lmforge tokens/s | peer tokens/s | ratio | MFU lmforge |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['row']} | {r['lmforge']:,.0f} | {r['peer']:,.0f} | {r['ratio']:.2f}x | {r['mfu']:.1%} |")
    print(json.dumps(rows, default=str), file=sys.stderr)


if __name__ == "__main__":
    main()
