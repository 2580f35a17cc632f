"""Data parallelism: 2 CPU processes on gloo under torchrun follow 1 process with the doubled batch.

Each process takes its rows of every micro-batch (the BatchSource sharding contract) and DDP averages
the gradients, so the loss curve of 2 x b rows equals that of 1 x 2b rows up to float rounding.
FSDP (parameters, gradients and AdamW state sharded over the 2 processes) follows the same curve.
One torchrun call trains with DDP, then with FSDP, in the same two processes.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from lmforge.train import TrainConfig, train
from train_toy import ToyLM, ToySource

SCRIPT = Path(__file__).with_name("train_toy.py")
STEPS, ACCUM = 5, 2

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")


def curve(run_dir: Path) -> list[tuple[str, int, float]]:
    events = map(json.loads, (run_dir / "log.jsonl").read_text().splitlines())
    return [(e["event"], e["step"], e.get("loss", e.get("eval_loss"))) for e in events]


def test_ddp_and_fsdp_follow_one_process_with_the_doubled_batch(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LMFORGE_TEST_KILL_AT_STEP"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           "--out", str(tmp_path / "ddp"), "--fsdp-out", str(tmp_path / "fsdp"), "--batch-size", "2",
           "--steps", str(STEPS), "--grad-accum", str(ACCUM), "--dropout", "0", "--save-every", "0",
           "--eval-every", str(STEPS)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    # meanwhile, the reference in this process: 1 process, 4 rows per micro-batch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        config = TrainConfig(lr=1e-2, warmup_steps=2, max_steps=STEPS, batch_size=4, grad_accum=ACCUM,
                             save_every=0, eval_every=STEPS, log_every=1, progress=False, plot=False)
        train(ToyLM(dropout=0.0), ToySource(4), config, tmp_path / "single")
    finally:
        torch.set_num_threads(threads)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]

    single = curve(tmp_path / "single")
    for mode in ("ddp", "fsdp"):
        two = curve(tmp_path / mode)
        assert [(e, s) for e, s, _ in two] == [(e, s) for e, s, _ in single], mode
        assert [v for *_, v in two] == pytest.approx([v for *_, v in single], abs=1e-5), mode
        assert (tmp_path / mode / "checkpoints" / f"step-{STEPS:06d}" / "model.safetensors").is_file()
