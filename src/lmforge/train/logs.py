"""What a run leaves to read: ``log.jsonl``, TensorBoard events (optional) and ``loss.png``.

``log.jsonl`` holds one JSON object per event, in order::

    {"event": "train", "step": 10, "loss": 6.91, "lr": 0.0003, "grad_norm": 1.2, "tokens": 40960,
     "tokens_per_s": 51200.0, "elapsed_s": 0.8}
    {"event": "eval", "step": 100, "eval_loss": 5.2, "eval_ppl": 181.3, "eval_accuracy": 0.21, "elapsed_s": 8.1}

``elapsed_s`` counts seconds since this process began training (a resumed run starts again from 0).

On resume, events after the checkpoint's step (written by the killed run, about to be redone) are
dropped, so the log and the plot read as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from lmforge.files import atomic_path, will_write, write_text_atomic


def info(message: str) -> None:
    """One line on standard error (progress and logs never go to standard output)."""
    print(f"lmforge: {message}", file=sys.stderr, flush=True)


class RunLog:
    """Appends events to ``log.jsonl`` (and TensorBoard) and keeps them for the loss plot."""

    def __init__(self, run_dir: Path, resume_step: int | None, tensorboard: bool, enabled: bool = True):
        self.path = Path(run_dir) / "log.jsonl"
        self.enabled = enabled
        self.events: list[dict[str, Any]] = []
        self.tb = None
        if not enabled:
            return
        if self.path.exists():
            kept = [e for e in read_events(self.path) if resume_step is not None and e.get("step", 0) <= resume_step]
            write_text_atomic(self.path, "".join(json.dumps(e) + "\n" for e in kept))
            self.events = kept
        if tensorboard:
            self.tb = _tensorboard_writer(Path(run_dir) / "tensorboard", purge_step=(resume_step or 0) + 1)

    def write(self, event: str, step: int, **values: Any) -> dict[str, Any]:
        record = {"event": event, "step": step, **{k: _clean(v) for k, v in values.items()}}
        if not self.enabled:
            return record
        self.events.append(record)
        will_write(self.path)
        with self.path.open("a", encoding="utf-8") as f:  # append-only: one whole line per record
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for k, v in record.items():
                if k not in ("event", "step") and isinstance(v, int | float):
                    self.tb.add_scalar(f"{event}/{k}", v, step)
        return record

    def plot(self, path: Path) -> None:
        if self.enabled:
            plot_loss(self.events, path)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of a ``log.jsonl``; a line cut short by a kill is skipped."""
    events = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events


def _clean(v: Any) -> Any:
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # JSON has no NaN / Infinity
    return v


def _tensorboard_writer(log_dir: Path, purge_step: int):
    try:
        import tensorboard  # noqa: F401  (SummaryWriter needs the package, not only torch)
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        info("tensorboard is not installed: skipping TensorBoard logs (pip install 'lmforge[tensorboard]')")
        return None
    before = set(log_dir.glob("events.out.tfevents.*"))
    writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)  # it opens its event file now, named by
    will_write(*(set(log_dir.glob("events.out.tfevents.*")) - before))  # TensorBoard: told to a claimed output
    return writer


def plot_loss(events: list[dict[str, Any]], path: Path) -> None:
    """Train and eval loss against step, written to ``path`` (PNG, via a temp file and a rename)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["loss"]) for e in events if e.get("event") == "train" and _finite(e.get("loss"))]
    evals = [(e["step"], e["eval_loss"]) for e in events if e.get("event") == "eval"
             and _finite(e.get("eval_loss"))]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if train:
        ax.plot(*zip(*train, strict=True), label="train", linewidth=1)
    if evals:
        ax.plot(*zip(*evals, strict=True), "o-", label="eval", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    ax.grid(alpha=0.3)
    if train or evals:
        ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp)
    plt.close(fig)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)
