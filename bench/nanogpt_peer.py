"""nanoGPT's ``train.py`` on the same job as ``lmforge pretrain``: the training peer of bench/gpu.py's pretrain row.

nanoGPT is not a package: its three files (``model.py``, ``train.py``, ``configurator.py``) at a pinned commit are
copied into a work folder with the data it reads (``data/<name>/train.bin``, ``val.bin`` as uint16 token ids,
``meta.pkl`` with the vocabulary size) and ``train.py`` runs there with the job's settings on its command line.
The job: the text's bytes as tokens (the vocabulary padded to ``vocab`` like lmforge's, a multiple of 64), the
GPT-2 124M shape, no biases, no dropout, batch x block tokens a step, bf16 autocast, ``torch.compile``.

Throughput is read the way lmforge's trainer reports its own: nanoGPT prints a line every ``log_every`` steps right
after reading the loss (its one sync), and the time between two such lines, as this process sees them arrive, is
``log_every`` steps of real time; the median interval after the first ``skip`` steps (compiling) gives tokens/s.

    git -C nanoGPT show 3adf61e154c3fe3fca428ad6bc3818b27a3b8291:train.py > .lease/nanogpt/train.py   # and the others
"""

from __future__ import annotations

import itertools
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COMMIT = "3adf61e154c3fe3fca428ad6bc3818b27a3b8291"  # karpathy/nanoGPT, the files bench/gpu_lease.sh carries
FILES = ("model.py", "train.py", "configurator.py")
ITER = re.compile(r"^iter (\d+): loss ([\d.naninf]+)")


def prepare(work: Path, text: str, vocab: int) -> None:
    """``data/bytes/``: the text's UTF-8 bytes, 90% train and 10% validation, and the padded vocabulary size."""
    ids = np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)
    data = work / "data" / "bytes"
    data.mkdir(parents=True)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    with (data / "meta.pkl").open("wb") as f:
        pickle.dump({"vocab_size": vocab}, f)


def nanogpt_tokens_per_s(source: Path, text: str, batch: int, block: int, steps: int, log_every: int = 10,
                         skip: int = 30, vocab: int = 320, device: str = "cuda", compile: bool = True,
                         shape: tuple[int, int, int] = (12, 12, 768), timeout: float = 480) -> dict:
    """Run nanoGPT's train.py from ``source`` (a folder holding its three files) on ``text``; its steady tokens/s,
    the intervals it came from, and its last loss."""
    layers, heads, d = shape
    with tempfile.TemporaryDirectory(prefix="nanogpt-") as tmp:
        work = Path(tmp)
        for name in FILES:
            shutil.copy(source / name, work / name)
        prepare(work, text, vocab)
        settings = dict(dataset="bytes", batch_size=batch, block_size=block, gradient_accumulation_steps=1,
                        max_iters=steps, lr_decay_iters=steps, warmup_iters=min(10, steps // 2), eval_interval=10**9,
                        eval_iters=1, log_interval=log_every, always_save_checkpoint=False, out_dir=str(work / "out"),
                        compile=compile, bias=False, dropout=0.0, device=device,
                        dtype="bfloat16" if device.startswith("cuda") else "float32", n_layer=layers, n_head=heads,
                        n_embd=d)
        command = [sys.executable, "train.py", *(f"--{k}={v}" for k, v in settings.items())]
        seen: list[tuple[int, float, float]] = []  # (iteration, arrival time, loss)
        proc = subprocess.Popen(command, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline, log = time.monotonic() + timeout, []
        for line in proc.stdout:
            log.append(line)
            if m := ITER.match(line):
                seen.append((int(m.group(1)), time.monotonic(), float(m.group(2))))
            if time.monotonic() > deadline:
                proc.kill()
                break
        if proc.wait() != 0 or len(seen) < 3:
            raise RuntimeError(f"nanoGPT train.py failed ({proc.returncode}): {''.join(log[-5:]).strip()}")
    steady = [(b[0] - a[0]) * batch * block / (b[1] - a[1]) for a, b in itertools.pairwise(seen)
              if a[0] >= skip]
    return {"tokens_per_s": statistics.median(steady), "intervals": [round(v) for v in steady],
            "final_loss": seen[-1][2], "commit": COMMIT}
