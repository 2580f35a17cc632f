"""The decoding engine's step on a GPU: wall time of one ``Engine.step`` and where it goes, graph runner vs eager.

    python3 bench/gpu_step.py --model SmolLM2-135M-Instruct.Q4_1.gguf        # bf16 on CUDA, rows 1 and 16
    .venv/bin/python bench/gpu_step.py --smoke                               # tiny shapes on CPU: the paths run

For each runner ("graphs": the lean step recorded as CUDA graphs, the CUDA default; "graphs-compiled": the lean step
through torch.compile, then recorded (``compile=True``); "eager": the model's own forward) and each number of held
requests (1, 16; 64 with --rows), an engine of --slots slots holds that many requests mid-reply (prompt 32 tokens,
greedy, no early stop) and runs --steps steps, timed by the host clock around a synchronised loop (each step reads
its tokens back, as a server does). Then a profile of 10 more steps (torch.profiler) splits a step into the GPU's
kernel time (the sum of kernel durations, and their count) and the rest, when no kernel runs (the host's Python,
dispatch and launch work the GPU waits for, and the gaps between kernels: in a CUDA graph, mostly the latter). The
floor beside it: the bytes a step must read (weights once, the keys and values of the held rows) over the copy
bandwidth measured in this run.

Each row is printed and appended to --out as JSON lines as it finishes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from llama_pair import lmforge_model

from lmforge.generation.engine import Engine, Request


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def copy_bandwidth(device: torch.device) -> float:
    """Bytes a second of a large device-to-device copy, counting bytes read and written."""
    n = 1 << 28 if device.type == "cuda" else 1 << 22
    a, b = torch.empty(n, dtype=torch.uint8, device=device), torch.empty(n, dtype=torch.uint8, device=device)
    for _ in range(3):
        b.copy_(a)
    sync(device)
    began = time.perf_counter()
    for _ in range(20):
        b.copy_(a)
    sync(device)
    return 2 * n * 20 / (time.perf_counter() - began)


def held_engine(model, runner: str, slots: int, rows: int, capacity: int, fused: bool = False) -> Engine:
    """An engine of ``slots`` slots, warmed up, holding ``rows`` requests past their prefills (``fused``: its lean
    step's attention as one fused call, lean.py)."""
    kind, _, how = runner.partition("-")  # "graphs-compiled": the graph runner of the step compiled first
    engine = Engine(model, slots=slots, capacity=capacity, runner=kind, compile=True if how == "compiled" else None)
    if fused and getattr(engine.runner, "lean", None) is not None:
        engine.runner.lean.fused = True
    engine.warmup()
    vocab = model.config.vocab_size
    for k in range(rows):
        ids = [(97 * k + 13 * j) % (vocab - 10) + 10 for j in range(32)]
        engine.submit(Request(ids, max_new_tokens=capacity - 40, stop_ids=[]))
    for _ in range(3):
        engine.step()
    return engine


def kernel_profile(engine: Engine, steps: int) -> tuple[float, int]:
    """(GPU kernel milliseconds a step, kernels a step) over ``steps`` steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / 1000 / steps, round(len(kernels) / steps)


def step_row(model, runner: str, slots: int, rows: int, capacity: int, steps: int, floor_bytes: float,
             bandwidth: float, fused: bool = False) -> dict:
    device = next(model.parameters()).device
    engine = held_engine(model, runner, slots, rows, capacity, fused)
    times = []
    for _ in range(3):  # three timed passes; the median pass is reported
        sync(device)
        began = time.perf_counter()
        for _ in range(steps):
            engine.step()
        sync(device)
        times.append((time.perf_counter() - began) / steps * 1000)
    row = {"bench": "gpu-step", "runner": runner, "attention": "fused" if fused else "matmul",
           "slots": slots, "rows": rows,
           "step_ms": round(statistics.median(times), 3), "step_ms_spread": [round(t, 3) for t in times],
           "tokens_per_s": round(rows * 1000 / statistics.median(times), 1),
           "floor_ms": round(1000 * floor_bytes / bandwidth, 4), "recorded_graphs": getattr(engine.runner,
                                                                                            "recorded", 0)}
    if device.type == "cuda":
        kernel_ms, kernels = kernel_profile(engine, 10)
        row.update(kernel_ms=round(kernel_ms, 3), kernels_per_step=kernels,
                   idle_ms=round(row["step_ms"] - kernel_ms, 3))
    engine.cancel_all()
    engine.run()
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model file or folder (default: SmolLM2-135M's shape, random weights)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    p.add_argument("--slots", type=int, default=16)
    p.add_argument("--capacity", type=int, default=512)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--runners", nargs="+", default=["graphs", "eager"],
                   help="graphs (the recorded lean step), graphs-compiled (compiled, then recorded), eager")
    p.add_argument("--attention", choices=["matmul", "fused"], default="matmul",
                   help="the lean step's attention: four calls, or one fused call (scaled_dot_product_attention)")
    p.add_argument("--smoke", action="store_true", help="a 2-layer model, 3 steps (CPU is fine)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "gpu-step.jsonl"))
    args = p.parse_args()
    device = torch.device(args.device)
    if args.smoke:
        from llama_pair import SMOLLM2_135M

        from lmforge.models import Decoder
        from lmforge.models.config import DecoderConfig

        model, what = Decoder(DecoderConfig(**{**SMOLLM2_135M, "n_layers": 2, "d_model": 64, "n_heads": 4,
                                               "n_kv_heads": 2, "d_ff": 128, "vocab_size": 512})), "smoke"
        args.steps, args.capacity = 3, 300
    else:
        model, what = lmforge_model(args.model)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = model.to(device, dtype).eval()
    bandwidth = copy_bandwidth(device)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    for runner in args.runners:
        for rows in args.rows:
            layers, kv = model.config.n_layers, model.layers[0].self_attn
            cache = 2 * layers * rows * kv.n_kv_heads * kv.d_qk * 64 * 2  # keys, values of ~64 columns a row
            try:
                row = step_row(model, runner, args.slots, rows, args.capacity, args.steps, weights + cache,
                               bandwidth, args.attention == "fused")
            except Exception as err:  # one failing row is reported; the others still run
                row = {"bench": "gpu-step", "runner": runner, "rows": rows, "error": f"{type(err).__name__}: {err}"}
            row.update(model=what, device=name, dtype=str(dtype), torch=torch.__version__,
                       copy_gb_s=round(bandwidth / 1e9, 1))
            with out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
