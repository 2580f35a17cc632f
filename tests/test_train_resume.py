"""Never lose a run: a training process killed with SIGKILL and restarted ends bit-identical (CPU).

The toy script (tests/train_toy.py) runs as a separate process; ``LMFORGE_TEST_KILL_AT_STEP=5`` makes
the trainer SIGKILL itself right after step 5, two steps past its step-3 checkpoint, so the resumed run
must recompute steps 4 and 5 with the restored weights, AdamW moments, data position and dropout RNG.
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from lmforge.train import latest_checkpoint

SCRIPT = Path(__file__).with_name("train_toy.py")


def run_toy(out: Path, kill_at: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("LMFORGE_TEST_KILL_AT_STEP", None)
    if kill_at is not None:
        env["LMFORGE_TEST_KILL_AT_STEP"] = str(kill_at)
    args = ["--out", str(out), "--steps", "8", "--save-every", "3", "--dropout", "0.2", "--grad-accum", "2"]
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=120)


def test_sigkill_then_resume_is_bit_identical(tmp_path):
    full = run_toy(tmp_path / "full")
    assert full.returncode == 0, full.stderr

    killed = run_toy(tmp_path / "cut", kill_at=5)
    assert killed.returncode == -signal.SIGKILL
    assert latest_checkpoint(tmp_path / "cut").step == 3

    resumed = run_toy(tmp_path / "cut")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr and "from step 3" in resumed.stderr
    a, b = json.loads(full.stdout), json.loads(resumed.stdout)
    assert b["resumed_from"] == 3 and a["loss"] == b["loss"]  # bit-identical final loss

    ca, cb = latest_checkpoint(tmp_path / "full"), latest_checkpoint(tmp_path / "cut")
    assert ca.step == cb.step == 8
    wa, wb = load_file(ca.path / "model.safetensors"), load_file(cb.path / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    oa, ob = ca.optimizer()["optimizer"]["state"], cb.optimizer()["optimizer"]["state"]
    assert all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i])

    def curve(run):  # the logged losses, without timings; the killed run's steps 4-5 were dropped
        lines = (run / "log.jsonl").read_text().splitlines()
        return [(e["event"], e["step"], e.get("loss"), e.get("eval_loss")) for e in map(json.loads, lines)]

    assert curve(tmp_path / "cut") == curve(tmp_path / "full")
