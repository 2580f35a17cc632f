"""Plots of the course: the sinusoidal positional encodings, and loss curves of several runs overlaid.

    >>> plot_positional_encoding("pe.png", n_positions=100, d_model=128)                    # doctest: +SKIP
    >>> plot_loss_curves(["runs/gpt-mini", "runs/gpt-mini-lr3e-3"], "loss.png")             # doctest: +SKIP

Confusion matrices are in ``lmforge.viz.confusion``; attention heatmaps and rollout in
``lmforge.viz.attention``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError


def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 100) -> Path:
    """Write ``fig`` to ``path`` atomically (folders created; the format from the suffix) and close it."""
    from lmforge.files import atomic_path

    plt = pyplot()
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=dpi)  # the temporary name keeps the suffix: the format follows it
    finally:
        plt.close(fig)
    return path


def plot_positional_encoding(path: str | Path, n_positions: int = 100, d_model: int = 128,
                             base: float = 10000.0) -> Path:
    """Heatmap of PE (n_positions, d_model), plus the first dimensions as curves, and their dot products.

    Left: PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(...): fast waves in the first
    columns, slow ones on the right. Middle: four dimensions against the position. Right: PE·PEᵀ, which
    depends only on the distance |p - q| (the diagonal bands), the property that lets attention find
    relative positions.
    """
    from lmforge.reference.positions import sinusoidal_positions

    if n_positions < 1 or d_model < 2:
        raise LmforgeError(f"positional encoding needs n_positions >= 1 and d_model >= 2, got {n_positions}, "
                           f"{d_model}")
    pe = sinusoidal_positions(n_positions, d_model, base)  # (N, D)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), gridspec_kw={"width_ratios": [1.25, 1, 1]})
    im = axes[0].imshow(pe, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    axes[0].set_xlabel("dimension")
    axes[0].set_ylabel("position")
    axes[0].set_title(f"sinusoidal positions ({n_positions} x {d_model})")
    fig.colorbar(im, ax=axes[0], fraction=0.046)
    for dim in sorted({2 * (d_model // k // 2) for k in (d_model, 8, 4, 2)}):  # 0, d/8, d/4, d/2 (sines)
        axes[1].plot(pe[:, dim], label=f"dim {dim}", linewidth=1.2)
    axes[1].set_xlabel("position")
    axes[1].set_title("dimension 2i: a sine, slower as i grows")
    axes[1].legend(fontsize=8, loc="lower left")
    im = axes[2].imshow(pe @ pe.T, cmap="viridis", aspect="auto", interpolation="nearest")
    axes[2].set_xlabel("position q")
    axes[2].set_ylabel("position p")
    axes[2].set_title("PE(p) · PE(q) depends on |p - q| only")
    fig.colorbar(im, ax=axes[2], fraction=0.046)
    fig.tight_layout()
    return save_figure(fig, path, dpi=80)


def read_run(run: str | Path) -> tuple[str, list[dict[str, Any]]]:
    """(label, events) of a run directory or a ``log.jsonl`` file; the label is the run's folder name."""
    from lmforge.train.logs import read_events

    run = Path(run)
    log = run / "log.jsonl" if run.is_dir() else run
    if not log.is_file():
        raise LmforgeError(f"{run}: no log.jsonl (not a run directory)")
    return (run.name if run.is_dir() else run.parent.name), read_events(log)


def _finite(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def smooth(values: Sequence[float], weight: float) -> list[float]:
    """Exponential moving average with bias correction (TensorBoard's smoothing); weight 0 = raw.

    >>> [round(v, 3) for v in smooth([1.0, 3.0], 0.5)]
    [1.0, 2.333]
    """
    out, avg = [], 0.0
    for n, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight**n) if weight else v)
    return out


def plot_loss_curves(runs: Sequence[str | Path], path: str | Path, labels: Sequence[str] | None = None,
                     smoothing: float = 0.0, log_y: bool = False) -> Path:
    """Train loss (lines) and eval loss (dots) of several runs on one set of axes, one colour per run."""
    if not runs:
        raise LmforgeError("plot_loss_curves: give at least one run")
    if labels is not None and len(labels) != len(runs):
        raise LmforgeError(f"plot_loss_curves: {len(runs)} runs but {len(labels)} labels")
    if not 0 <= smoothing < 1:
        raise LmforgeError(f"smoothing must be in [0, 1), got {smoothing}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, run in enumerate(runs):
        name, events = read_run(run)
        name = labels[k] if labels is not None else name
        colour = colours[k % len(colours)]
        train = [(e["step"], e["loss"]) for e in events if e.get("event") == "train" and _finite(e.get("loss"))]
        evals = [(e["step"], e["eval_loss"]) for e in events if e.get("event") == "eval"
                 and _finite(e.get("eval_loss"))]
        if train:
            steps, losses = zip(*train, strict=True)
            ax.plot(steps, smooth(losses, smoothing), color=colour, linewidth=1.2, label=f"{name} train")
        if evals:
            steps, losses = zip(*evals, strict=True)
            ax.plot(steps, losses, "o--", color=colour, markersize=4, linewidth=0.8, label=f"{name} eval")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats / token)")
    if log_y:
        ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("loss curves" + (f" (train smoothed {smoothing:g})" if smoothing else ""))
    fig.tight_layout()
    return save_figure(fig, path)
