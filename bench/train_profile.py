"""One training step of lmforge's GPT against nanoGPT's ``GPT``, in one process: the time of each and where it goes.

    python3 bench/train_profile.py --nanogpt .lease/part1/nanogpt              # GPT-2 124M shape on CUDA
    .venv/bin/python bench/train_profile.py --nanogpt .lease/part1/nanogpt --smoke   # tiny shapes on CPU

The same job as bench/gpu.py's pretrain row without the workflows around it: GPT-2 124M shape without biases,
vocabulary 320, batch 16 x 1024 random tokens, bf16 autocast, ``torch.compile`` on CUDA, fused AdamW (lmforge's
``build_optimizer``; nanoGPT's ``configure_optimizers``), gradient clipping at 1.0 on both. Each step is forward,
backward, clip, optimizer step, zero_grad. The two are timed in alternated rounds (medians and spread), then each
step is profiled (``torch.profiler``) and its kernels summed by kind: matrix products, attention, the compiled
(Triton) fusions, the optimizer, the rest, against the step's wall time (the difference: the GPU waiting for the
host). A gap between the two shows in the kind that differs. A third contender on CUDA, "lmforge, measured kernel
order", is lmforge's model with torch's attention kernels in the order the Trainer measures at a run's start
(train/attention_kernel.py; the plain "lmforge" row keeps torch's own order, as nanoGPT does). A fourth, "lmforge
Trainer.train_step", is the trainer's own step on the same model and rows: against the bare "lmforge" step it
shows what the loop around the model costs (the end-to-end pretrain row reached 92% of the bare step in the lease
of 2026-11-27). Rows go to --out as JSON lines.
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel

from lmforge.models import Decoder, get_preset
from lmforge.train import TrainConfig
from lmforge.train.attention_kernel import measure, ranked
from lmforge.train.optim import build_optimizer

KINDS = (("matrix products", ("gemm", "gemv", "cutlass", "sm90_xmma", "nvjet", "ampere_", "addmm", "mm_")),
         ("attention", ("flash", "fmha", "attention", "efficient", "sdpa", "cudnn")),
         ("optimizer", ("adam", "foreach", "multi_tensor", "fused_adam")),
         ("compiled fusions", ("triton_",)))


def nanogpt_model(folder: Path, shape: tuple[int, int, int], block: int, vocab: int) -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("nanogpt_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    layers, heads, d = shape
    config = module.GPTConfig(block_size=block, vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=d,
                              dropout=0.0, bias=False)
    return module.GPT(config)


def lmforge_model(shape: tuple[int, int, int], block: int, vocab: int) -> torch.nn.Module:
    layers, heads, d = shape
    config = get_preset("gpt-tiny", vocab_size=vocab, d_model=d, n_layers=layers, n_heads=heads, d_ff=4 * d,
                        max_positions=block, dropout=0.0, attention_dropout=0.0, bias=False)
    return Decoder(config)


def step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, targets: torch.Tensor,
            device: torch.device, nanogpt: bool) -> Callable[[], None]:
    compiled = torch.compile(model) if device.type == "cuda" else model
    amp = torch.bfloat16 if device.type == "cuda" else None

    def step() -> None:
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = compiled(ids, targets)[1] if nanogpt else compiled(input_ids=ids, labels=targets).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def trainer_step(shape: tuple[int, int, int], block: int, vocab: int, ids: torch.Tensor, settings: TrainConfig,
                 folder: str) -> Callable[[], None]:
    """``Trainer.train_step`` of lmforge's model on ``ids`` every step: the step ``lmforge pretrain`` runs (its
    batch pinned and copied, lr set, the loss weighted, clipping, the non-finite watch, the next batch queued), as
    the bare ``lmforge`` step runs the model alone. Compiled on CUDA, as the trainer compiles by default."""
    from lmforge.train.trainer import Trainer

    class Source:  # the same rows every step, from the host (as a corpus's are)
        def batch(self, step: int, micro: int, rank: int = 0, world_size: int = 1) -> dict:
            return {"input_ids": ids.cpu(), "labels": ids.cpu()}

    trainer = Trainer(lmforge_model(shape, block, vocab), Source(), settings, folder)
    trainer.setup()
    steps = iter(range(1, settings.max_steps))
    return lambda: trainer.train_step(next(steps))


def in_order(order: list, step: Callable[[], None]) -> Callable[[], None]:
    """``step`` with torch's attention kernels tried in ``order`` (the compiled step keeps what it traced)."""
    def ordered() -> None:
        with sdpa_kernel(order, set_priority=True):
            step()

    return ordered


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def profile(step: Callable[[], None], device: torch.device, steps: int = 3) -> dict:
    """Kernel milliseconds a step by kind, their sum, and the step's wall milliseconds."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sync(device)
    began = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        sync(device)
    wall = (time.perf_counter() - began) / steps * 1000
    kinds = dict.fromkeys([k for k, _ in KINDS] + ["other"], 0.0)
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    for e in kernels:
        name = e.name.lower()
        kind = next((k for k, keys in KINDS if any(key in name for key in keys)), "other")
        kinds[kind] += e.device_time / 1000 / steps
    total = sum(kinds.values())
    return {"wall_ms": round(wall, 2), "kernel_ms": round(total, 2), "kernels_per_step": round(len(kernels) / steps),
            **{f"{k}_ms": round(v, 2) for k, v in kinds.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nanogpt", required=True, help="the folder holding nanoGPT's model.py")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--smoke", action="store_true", help="2 layers of width 64, batch 2 x 64 (CPU is fine)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "train-profile.jsonl"))
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    shape, batch, block = ((2, 2, 64), 2, 64) if args.smoke else ((12, 12, 768), 16, 1024)
    rounds, steps = (1, 2) if args.smoke else (args.rounds, args.steps)
    vocab = 320
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 257, (batch, block + 1), generator=g).to(device)
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    torch.manual_seed(0)
    ours = lmforge_model(shape, block, vocab).to(device).train()
    theirs = nanogpt_model(Path(args.nanogpt), shape, block, vocab).to(device).train()
    settings = TrainConfig(lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, device=str(device))
    ours_opt = build_optimizer(ours, settings, device)  # what the Trainer builds
    theirs_opt = theirs.configure_optimizers(0.1, 6e-4, (0.9, 0.95), device.type)
    fns = {"lmforge": step_fn(ours, ours_opt, x, y, device, False),
           "nanoGPT": step_fn(theirs, theirs_opt, x, y, device, True)}
    loop = TrainConfig(lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), grad_clip=1.0, device=str(device),
                       batch_size=batch, max_steps=10**6, log_every=0, save_every=0, progress=False, plot=False,
                       tensorboard=False)
    fns["lmforge Trainer.train_step"] = trainer_step(shape, block, vocab, x, loop, tempfile.mkdtemp())
    # what the Trainer does on CUDA: torch's attention kernels in the order measured at the run's start
    # (train/attention_kernel.py), held while the step compiles and runs; the plain "lmforge" keeps torch's order
    chosen = copy.deepcopy(ours)
    measured = measure(chosen, batch, block, torch.bfloat16, device)
    if len(measured) > 1:
        print(f"attention kernels, one forward and backward: {measured}", file=sys.stderr)
        fns["lmforge, measured kernel order"] = in_order(ranked(measured), step_fn(
            chosen, build_optimizer(chosen, settings, device), x, y, device, False))
    for fn in fns.values():  # compile and warm
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            began = time.perf_counter()
            for _ in range(steps):
                fn()
            sync(device)
            times[name].append((time.perf_counter() - began) / steps * 1000)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name, fn in fns.items():
        model = {"lmforge": ours, "nanoGPT": theirs, "lmforge Trainer.train_step": ours}.get(name, chosen)
        row = {"bench": "train-profile", "model": name, "step_ms": round(statistics.median(times[name]), 2),
               "step_ms_rounds": [round(t, 2) for t in times[name]],
               "tokens_per_s": round(batch * block * 1000 / statistics.median(times[name])),
               "parameters": sum(p.numel() for p in model.parameters()),
               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "smoke": args.smoke}
        if device.type == "cuda":
            row.update(profile(fn, device))
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    for name in fns:
        if name != "nanoGPT":
            ratio = statistics.median(times["nanoGPT"]) / statistics.median(times[name])
            print(f"{name} / nanoGPT step speed: {ratio:.3f}x", file=sys.stderr)


if __name__ == "__main__":
    main()
