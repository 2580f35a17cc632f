"""The confusion matrix as a PNG: rows are gold labels, columns predictions, each row normalised.

    >>> plot_confusion([[8, 2], [1, 9]], ["certain", "uncertain"], "confusion.png")   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lmforge.viz.plots import save_figure


def plot_confusion(matrix: Sequence[Sequence[int]] | np.ndarray, names: Sequence[str], path: str | Path,
                   title: str = "confusion matrix") -> Path:
    """Write a heatmap of ``matrix`` (C, C) with the counts printed when C <= 20; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = np.asarray(matrix, dtype=np.float64)  # (C, C)
    rates = m / np.maximum(m.sum(axis=1, keepdims=True), 1)  # each gold row sums to 1
    c = len(names)
    size = min(max(4.0, 0.32 * c + 2.5), 16.0)
    fig, ax = plt.subplots(figsize=(size, size * 0.9))
    im = ax.imshow(rates, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(c), [str(n) for n in names], rotation=90 if c > 6 else 0, fontsize=8 if c > 12 else 10)
    ax.set_yticks(range(c), [str(n) for n in names], fontsize=8 if c > 12 else 10)
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    ax.set_title(title)
    if c <= 20:
        for i in range(c):
            for j in range(c):
                if m[i, j]:
                    ax.text(j, i, f"{int(m[i, j])}", ha="center", va="center", fontsize=8,
                            color="white" if rates[i, j] > 0.5 else "black")
    fig.colorbar(im, ax=ax, fraction=0.046, label="share of the gold row")
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
