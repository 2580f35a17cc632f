"""lmforge vs transformers: training-step and generation throughput, same configs, same process, same threads.

    .venv/bin/python bench/models.py                 # CPU, about 2-3 minutes on 2 cores
    .venv/bin/python bench/models.py --quick         # smaller batches, fewer rounds (< 1 minute)
    .venv/bin/python bench/models.py --threads 1 --clock cpu     # steadier numbers on a busy, shared machine
    .venv/bin/python bench/models.py --device cuda --gpt2-mfu     # GPT-2 124M, bf16 autocast, on a GPU

Rows (the sizes of issue 4):
    BERT masked LM training step   hidden 256, 4 layers, 4 heads, FFN 1024, vocab 8192, seq 128, batch 32
    GPT causal LM training step    same sizes, seq 256, batch 16
    GPT generation, KV cache       batch 1, prompt 16, 200 new tokens, greedy

A training step is forward + backward + AdamW step (fused where the build has it), in train mode with
dropout 0.1 on both sides. Each library is warmed up, then the two are timed in alternating rounds
(lmforge, transformers, lmforge, ...) so that a noisy neighbour hurts both alike; the best round of
each is reported (the least disturbed one). MFU is model FLOPs per second over the fp32 matmul peak
measured in the same run (a large square matmul):

    training FLOPs / token  = 6 N + 12 L T d     N = weights used in matmuls (LM head included), PaLM's count;
                                                 for masked LM the head counts only on the labelled positions
    generation FLOPs / token = 2 N + 4 L t d     t = the tokens attended to at that step

``--gpt2-mfu`` trains GPT-2 124M (seq 1024, batch 8) under bf16 autocast with both libraries and reports
MFU against the bf16 matmul peak measured on the same device (an 8192^3 matmul).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lmforge.generation import generate
from lmforge.models import Decoder, DecoderConfig, EncoderConfig
from lmforge.models.encoder import EncoderForPreTraining

warnings.filterwarnings("ignore")
# Wall-clock by default; ``--clock cpu`` times this process's CPU seconds instead, which a busy machine
# (other jobs on the same cores) disturbs far less. Both libraries are always timed with the same clock.
CLOCK = [time.perf_counter]


@dataclass
class Sizes:
    vocab: int = 8192
    d: int = 256
    layers: int = 4
    heads: int = 4
    ff: int = 1024


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int) -> float:
    """FLOP/s of an n x n x n matmul, best of ``reps``: the denominator of MFU."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        sync(device)
        start = CLOCK[0]()
        a @ b
        sync(device)
        best = min(best, CLOCK[0]() - start)
    return 2 * n**3 / best


def matmul_weights(s: Sizes, mlm: bool = False) -> int:
    """N, the weights that take part in matmuls: per layer W_qkv, W_o (4 d²) and the FFN (2 d d_ff), plus the
    vocabulary projection (V d, tied or not) and, for BERT's MLM head, its d x d transform. No embedding lookups.
    """
    return s.layers * (4 * s.d * s.d + 2 * s.d * s.ff) + s.vocab * s.d + (s.d * s.d if mlm else 0)


# -- the models, built from the same sizes --------------------------------------------------------
def bert_pair(s: Sizes, seq: int):
    import transformers

    ours = EncoderForPreTraining(EncoderConfig(vocab_size=s.vocab, d_model=s.d, n_layers=s.layers, n_heads=s.heads,
                                               d_ff=s.ff, max_positions=max(seq, 512)))
    hf_config = transformers.BertConfig(vocab_size=s.vocab, hidden_size=s.d, num_hidden_layers=s.layers,
                                        num_attention_heads=s.heads, intermediate_size=s.ff,
                                        max_position_embeddings=max(seq, 512), hidden_dropout_prob=0.1,
                                        attention_probs_dropout_prob=0.1)
    hf = transformers.BertForMaskedLM._from_config(hf_config, attn_implementation="sdpa")
    return ours, hf


def gpt_pair(s: Sizes, seq: int, dropout: float = 0.1):
    import transformers

    ours = Decoder(DecoderConfig(vocab_size=s.vocab, d_model=s.d, n_layers=s.layers, n_heads=s.heads, d_ff=s.ff,
                                 max_positions=seq, dropout=dropout, attention_dropout=dropout))
    hf_config = transformers.GPT2Config(vocab_size=s.vocab, n_positions=seq, n_embd=s.d, n_layer=s.layers,
                                        n_head=s.heads, n_inner=s.ff, resid_pdrop=dropout, embd_pdrop=dropout,
                                        attn_pdrop=dropout, bos_token_id=0, eos_token_id=0)
    hf = transformers.GPT2LMHeadModel._from_config(hf_config, attn_implementation="sdpa")
    return ours, hf


def mlm_batch(s: Sizes, batch: int, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids; 15% of positions carry a label (the rest -100), as in BERT pre-training."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, s.vocab, (batch, seq), generator=g)
    labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return ids.to(device), labels.to(device)


def optimizer(model: torch.nn.Module, device: torch.device) -> torch.optim.Optimizer:
    try:
        return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    except (RuntimeError, TypeError):
        return torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)


def train_step_fn(model: torch.nn.Module, ids: torch.Tensor, labels: torch.Tensor, device: torch.device,
                  amp: torch.dtype | None = None) -> Callable[[], None]:
    model.to(device).train()
    opt = optimizer(model, device)

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def alternate(fns: dict[str, Callable[[], None]], warmup: int, rounds: int, steps: int,
              device: torch.device) -> dict[str, float]:
    """Best per-call seconds of each fn, timed in alternating rounds of ``steps`` calls."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            start = CLOCK[0]()
            for _ in range(steps):
                fn()
            sync(device)
            times[name].append((CLOCK[0]() - start) / steps)
    for name, ts in times.items():
        print(f"  {name}: rounds {', '.join(f'{t * 1e3:.0f}' for t in ts)} ms "
              f"(median {statistics.median(ts) * 1e3:.0f})", file=sys.stderr)
    return {name: min(ts) for name, ts in times.items()}


# -- rows -----------------------------------------------------------------------------------------
def train_row(name: str, pair, batch: int, seq: int, s: Sizes, args, device, peak: float,
              amp: torch.dtype | None = None) -> dict:
    ours, hf = pair
    mlm = name.startswith("BERT")
    if mlm:
        ids, labels = mlm_batch(s, batch, seq, device)
    else:
        ids = torch.randint(0, s.vocab, (batch, seq), generator=torch.Generator().manual_seed(0)).to(device)
        labels = ids
    n_ours, n_hf = (sum(p.numel() for p in m.parameters()) for m in pair)
    print(f"{name}: parameters lmforge {n_ours:,} transformers {n_hf:,}", file=sys.stderr)
    flops_per_token = 6 * matmul_weights(s, mlm=mlm) + 12 * s.layers * seq * s.d
    if mlm:  # the MLM loss needs its head (d x d transform, V x d projection) on the labelled positions only
        labelled = (labels != -100).float().mean().item()
        flops_per_token -= 6 * (1 - labelled) * (s.d * s.d + s.vocab * s.d)
    best = alternate({"lmforge": train_step_fn(ours, ids, labels, device, amp),
                      "transformers": train_step_fn(hf, ids, labels, device, amp)},
                     args.warmup, args.rounds, args.steps, device)
    tokens = batch * seq
    return row(name, tokens / best["lmforge"], tokens / best["transformers"], flops_per_token, peak)


def generation_row(s: Sizes, args, device, peak: float) -> dict:
    prompt, new = 16, args.new_tokens
    ours, hf = gpt_pair(s, prompt + new, dropout=0.0)
    ours.to(device).eval()
    hf.to(device).eval()
    ids = torch.randint(0, s.vocab, (1, prompt), generator=torch.Generator().manual_seed(0)).to(device)

    def run_ours() -> None:
        generate(ours, ids, max_new_tokens=new, stop_ids=[])

    def run_hf() -> None:
        with torch.inference_mode():
            hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    a = generate(ours, ids, max_new_tokens=new, stop_ids=[]).tokens
    with torch.inference_mode():
        b = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    assert a.shape[1] == b.shape[1] - prompt == new, "both libraries must generate every token"
    mean_context = prompt + new / 2
    flops_per_token = 2 * matmul_weights(s) + 4 * s.layers * mean_context * s.d
    best = alternate({"lmforge": run_ours, "transformers": run_hf}, 1, args.gen_rounds, 1, device)
    return row(f"GPT generation, KV cache (batch 1, prompt {prompt}, {new} new)", new / best["lmforge"],
               new / best["transformers"], flops_per_token, peak)


def row(name: str, ours: float, hf: float, flops_per_token: float, peak: float) -> dict:
    """A table row: tokens/s of each library and their MFU (model FLOPs per token x tokens/s / peak)."""
    mfu_ours = ours * flops_per_token / peak
    return {"row": name, "lmforge": ours, "transformers": hf, "ratio": ours / hf,
            "mfu_lmforge": mfu_ours, "mfu_transformers": hf * flops_per_token / peak}


def print_table(rows: list[dict], peak: float, dtype_name: str) -> None:
    print(f"\nmatmul peak ({dtype_name}, measured): {peak / 1e9:.0f} GFLOP/s; threads {torch.get_num_threads()}, "
          f"torch {torch.__version__}")
    print("| row | lmforge tokens/s | transformers tokens/s | ratio | MFU lmforge | MFU transformers |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['row']} | {r['lmforge']:,.0f} | {r['transformers']:,.0f} | {r['ratio']:.2f}x "
              f"| {r['mfu_lmforge']:.1%} | {r['mfu_transformers']:.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smaller batches and fewer rounds")
    p.add_argument("--threads", type=int, default=0, help="torch threads for both libraries (default: torch's)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="wall-clock (default) or process CPU time (steadier on a shared, busy machine)")
    p.add_argument("--gpt2-mfu", action="store_true", help="GPT-2 124M bf16 training step (GPU)")
    p.add_argument("--only", choices=["bert", "gpt", "generate"], action="append", help="run only these rows")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    quick = args.quick
    args.warmup, args.rounds, args.steps = (1, 2, 1) if quick else (1, 4, 1)
    args.gen_rounds, args.new_tokens = (2, 50) if quick else (4, 200)
    if args.clock == "cpu" and device.type == "cpu":
        CLOCK[0] = time.process_time
    print(f"load average before: {load()}", file=sys.stderr)
    s = Sizes()
    rows = []

    if args.gpt2_mfu:
        peak = matmul_peak(device, torch.bfloat16, 8192, 10)
        seq, batch = 1024, 4 if quick else 8
        s2 = Sizes(vocab=50257, d=768, layers=12, heads=12, ff=3072)
        rows.append(train_row(f"GPT-2 124M training step, bf16 (seq {seq}, batch {batch})",
                              gpt_pair(s2, seq), batch, seq, s2, args, device, peak, amp=torch.bfloat16))
        print_table(rows, peak, "bf16")
        return

    peak = matmul_peak(device, torch.float32, 1024 if quick else 2048, 5)
    only = set(args.only or ["bert", "gpt", "generate"])
    if "bert" in only:
        batch, seq = (8, 128) if quick else (32, 128)
        rows.append(train_row(f"BERT masked LM training step (seq {seq}, batch {batch})", bert_pair(s, seq),
                              batch, seq, s, args, device, peak))
    if "gpt" in only:
        batch, seq = (4, 256) if quick else (16, 256)
        rows.append(train_row(f"GPT causal LM training step (seq {seq}, batch {batch})", gpt_pair(s, seq),
                              batch, seq, s, args, device, peak))
    if "generate" in only:
        rows.append(generation_row(s, args, device, peak))
    print_table(rows, peak, "fp32")
    print(f"clock: {args.clock}; load average after: {load()} on {os.cpu_count()} cores")


def load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


if __name__ == "__main__":
    main()
