"""Where a caption decoder looked: one heatmap over the X x Y feature grid per generated word.

``maps[t, x, y]`` is α[x, y] of the step that produced word t (``GridCaptioner.attention_maps``); each
panel sums to 1 over the grid. Cell x is drawn as row x (top to bottom), cell y as column y, the way
the grid M[x, y, K] is indexed. Optional ``cell_labels`` write what sits in a cell (e.g. the true object)
so the picture shows at a glance whether the peak is on it.

    >>> maps = model.attention_maps(grid, caption)                        # doctest: +SKIP
    >>> plot_grid_attention(maps.numpy(), words, "caption.png")           # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.viz.plots import save_figure

DPI = 100
COLUMNS = 5  # panels per row


def plot_grid_attention(
    maps: np.ndarray,
    words: Sequence[str],
    path: str | Path,
    cell_labels: dict[tuple[int, int], str] | None = None,
    row_labels: Sequence[str] | None = None,
    column_labels: Sequence[str] | None = None,
    title: str | None = None,
) -> Path:
    """Write a PNG with one (X, Y) heatmap per word: maps (T, X, Y), words T labels; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maps = np.asarray(maps, dtype=float)
    if maps.ndim != 3 or maps.shape[0] != len(words):
        raise LmforgeError(f"maps must have shape (len(words)={len(words)}, X, Y), got {maps.shape}")
    n, gx, gy = maps.shape
    cols = max(1, min(n, COLUMNS))
    rows = max(1, math.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols + 0.8, 2.3 * rows + 0.5), squeeze=False)
    im = None
    for i, ax in enumerate(axes.flat):
        if i >= n:
            ax.axis("off")
            continue
        im = ax.imshow(maps[i], cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
        ax.set_title(f"{i + 1}: {words[i]}", fontsize=10)
        ax.set_xticks(range(gy), list(column_labels) if column_labels else range(gy), fontsize=6)
        ax.set_yticks(range(gx), list(row_labels) if row_labels else range(gx), fontsize=6)
        peak = np.unravel_index(int(maps[i].argmax()), (gx, gy))
        ax.add_patch(plt.Rectangle((peak[1] - 0.5, peak[0] - 0.5), 1, 1, fill=False, edgecolor="crimson", lw=1.5))
        for (x, y), label in (cell_labels or {}).items():
            ax.text(y, x, label, ha="center", va="center", fontsize=6,
                    color="white" if maps[i, x, y] > 0.5 else "#333333")
    if im is not None:
        fig.colorbar(im, ax=axes, fraction=0.02, pad=0.02, label="attention α[x, y] (heads, layers averaged)")
    fig.suptitle(title or "cross-attention over the grid, per generated word (red box: peak)", fontsize=11)
    return save_figure(fig, path, dpi=DPI)
