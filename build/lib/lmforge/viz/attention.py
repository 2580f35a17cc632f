"""Attention heatmaps as PNG: one head, one layer's heads, one head across layers, or every layer x head.

Rows are queries (the token that reads), columns keys (the token read); cell (i, j) is the weight of
key j in query i's row, so every row sums to 1. The colour scale is a square root (PowerNorm 0.5) from
0 to 1, so that a weight of 0.05 is still visible next to one of 0.9; cells a mask forbids (the upper
triangle of a causal decoder) are grey.

    >>> maps = attention_maps(model, tokenizer, "Juventus lost from Ajax")      # doctest: +SKIP
    >>> plot_attention(maps.view(), "layer2.png", layer=2)      # 12 heads of layer 2, token labels  # doctest: +SKIP
    >>> plot_attention(maps.view(), "all.png")                  # 6 x 12 thumbnails  # doctest: +SKIP
    >>> plot_attention(maps.view(), "l2h3.png", layer=2, head=3)   # one head, weights printed  # doctest: +SKIP

``figure_size`` says how large the figure will be (inches, at ``DPI``), so the PNG is
``round(w * DPI) x round(h * DPI)`` pixels.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.viz.plots import save_figure
from lmforge.viz.views import AttentionView

DPI = 100
GRID_COLUMNS = 4  # panels per row when one layer's heads (or one head's layers) are shown
LABELS_UP_TO = 40  # tokens: beyond this, axes carry no token labels
NUMBERS_UP_TO = 14  # tokens: up to this, a single head's weights are printed in the cells


def check_index(value: int | None, n: int, name: str) -> int | None:
    """``value`` in 0..n-1 (negative counts from the end), or a one-line error naming ``--name``."""
    if value is None:
        return None
    if not -n <= value < n:
        raise LmforgeError(f"--{name}: {value} is out of range; the model has {n} {name}s (0..{n - 1})")
    return value % n


def panels(view: AttentionView, layer: int | None, head: int | None) -> tuple[list[tuple[int, int]], int, int]:
    """The (layer, head) panels to draw and the grid (rows, columns) they go in."""
    n_layers, n_heads = view.weights.shape[:2]
    layer, head = check_index(layer, n_layers, "layer"), check_index(head, n_heads, "head")
    if layer is not None and head is not None:
        return [(layer, head)], 1, 1
    if layer is None and head is None:
        return [(lay, h) for lay in range(n_layers) for h in range(n_heads)], n_layers, n_heads
    chosen = [(layer, h) for h in range(n_heads)] if layer is not None else [(lay, head) for lay in range(n_layers)]
    cols = min(len(chosen), GRID_COLUMNS)
    return chosen, math.ceil(len(chosen) / cols), cols


def figure_size(rows: int, cols: int, n_tokens: int, thumbnails: bool) -> tuple[float, float]:
    """Width and height in inches: panels grow with the number of tokens, within limits."""
    if rows == cols == 1:
        side = min(max(3.0 + 0.3 * n_tokens, 5.0), 16.0)
        return side + 1.0, side  # + colour bar
    panel = min(max(0.12 * n_tokens, 1.0), 2.0) if thumbnails else min(max(1.2 + 0.2 * n_tokens, 2.8), 6.0)
    width = min(cols * panel + 1.5, 40.0)
    height = min(rows * panel + 1.2, 40.0)
    return round(width, 2), round(height, 2)


def _cmap(masked_grey: bool):
    import matplotlib

    cmap = matplotlib.colormaps["Blues"]
    return cmap.with_extremes(bad="#e0e0e0") if masked_grey else cmap


def _draw(ax, w: np.ndarray, view: AttentionView, cmap, norm, xlabels: bool, ylabels: bool, numbers: bool,
          fontsize: float):
    """One (Tq, Tk) heatmap on ``ax``."""
    shown = np.ma.masked_where(np.triu(np.ones_like(w, dtype=bool), 1) & (w == 0), w) if view.causal else w
    im = ax.imshow(shown, cmap=cmap, norm=norm, interpolation="nearest", aspect="auto")
    ax.set_xticks(range(len(view.keys)), view.keys if xlabels else [], rotation=90, fontsize=fontsize)
    ax.set_yticks(range(len(view.queries)), view.queries if ylabels else [], fontsize=fontsize)
    if not xlabels:
        ax.tick_params(axis="x", length=0)
    if not ylabels:
        ax.tick_params(axis="y", length=0)
    if numbers:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                if w[i, j] >= 0.005:
                    ax.text(j, i, f"{w[i, j]:.2f}".lstrip("0"), ha="center", va="center", fontsize=fontsize * 0.8,
                            color="white" if w[i, j] > 0.45 else "#333333")
    return im


def plot_attention(view: AttentionView, path: str | Path, layer: int | None = None, head: int | None = None,
                   title: str | None = None) -> Path:
    """Write the heatmaps of ``view`` to ``path`` (PNG); ``layer`` / ``head`` pick what is shown (module doc)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    chosen, rows, cols = panels(view, layer, head)
    n_tokens = max(len(view.queries), len(view.keys))
    thumbnails = layer is None and head is None and len(chosen) > 1
    fig, axes = plt.subplots(1 if thumbnails else rows, 1 if thumbnails else cols, dpi=DPI, squeeze=False,
                             figsize=figure_size(rows, cols, n_tokens, thumbnails))
    cmap, norm = _cmap(view.causal), PowerNorm(gamma=0.5, vmin=0.0, vmax=1.0)
    if thumbnails:
        fig.subplots_adjust(left=0.07, right=0.97, bottom=0.1, top=0.92)
        _mosaic(axes[0, 0], view, cmap, norm)
        fig.colorbar(matplotlib.cm.ScalarMappable(norm, cmap), ax=axes[0, 0], fraction=0.015, pad=0.01,
                     label="attention weight")
        fig.suptitle(title or view.label, fontsize=10)
        return _save(fig, path)
    single = len(chosen) == 1
    labels = n_tokens <= LABELS_UP_TO
    fontsize = 9.0 if single else 6.5
    im = None
    for k, ax in enumerate(axes.flat):
        if k >= len(chosen):
            ax.axis("off")
            continue
        lay, h = chosen[k]
        im = _draw(ax, view.weights[lay, h], view, cmap, norm, labels, labels, single and n_tokens <= NUMBERS_UP_TO,
                   fontsize)
        ax.set_title(f"layer {lay}, head {h}", fontsize=10 if single else 8)
    if single:
        axes[0, 0].set_xlabel("key (attended to)")
        axes[0, 0].set_ylabel("query (attending)")
        fig.colorbar(im, ax=axes[0, 0], fraction=0.046, pad=0.03, label="attention weight")
    fig.suptitle(title or view.label, fontsize=11 if single else 10)
    fig.tight_layout()
    return _save(fig, path)


def _mosaic(ax, view: AttentionView, cmap, norm) -> None:
    """Every layer x head as one RGBA picture on one axes (fast for 100+ panels): layers down, heads across.

    Panels are separated by one white cell; token labels go along the left and bottom edges when short.
    """
    n_layers, n_heads, tq, tk = view.weights.shape
    gap = 1
    rgba = np.ones((n_layers * (tq + gap) - gap, n_heads * (tk + gap) - gap, 4))  # white everywhere
    blocked = np.triu(np.ones((tq, tk), dtype=bool), 1) if view.causal else np.zeros((tq, tk), dtype=bool)
    for lay in range(n_layers):
        for h in range(n_heads):
            w = view.weights[lay, h]
            colours = cmap(norm(np.clip(w, 0.0, 1.0)))  # (Tq, Tk, 4)
            colours[blocked & (w == 0)] = cmap.get_bad()
            r, c = lay * (tq + gap), h * (tk + gap)
            rgba[r:r + tq, c:c + tk] = colours
    ax.imshow(rgba, interpolation="nearest", aspect="auto")
    small = max(tq, tk) <= 20
    ys = [lay * (tq + gap) + i for lay in range(n_layers) for i in range(tq)] if small else []
    xs = [h * (tk + gap) + j for h in range(n_heads) for j in range(tk)] if small else []
    ax.set_yticks(ys, view.queries * n_layers if small else [], fontsize=4.5)
    ax.set_xticks(xs, view.keys * n_heads if small else [], rotation=90, fontsize=4.5)
    ax.tick_params(length=0, pad=1)
    for lay in range(n_layers):
        ax.annotate(f"layer {lay}", xy=(0, 1 - (lay + 0.5) / n_layers), xycoords="axes fraction",
                    xytext=(-34 if small else -4, 0), textcoords="offset points", rotation=90, ha="right",
                    va="center", fontsize=8)
    for h in range(n_heads):
        ax.text((h + 0.5) / n_heads, 1.005, f"head {h}", transform=ax.transAxes, ha="center", va="bottom",
                fontsize=7)
    for side in ax.spines.values():
        side.set_visible(False)


def plot_rollout(tokens: list[str], rollout: np.ndarray, path: str | Path, title: str = "attention rollout"
                 ) -> Path:
    """Heatmap of a rollout (T, T) (see ``lmforge.workflows.inspect.attention_rollout``): rows read from columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    view = AttentionView("rollout", tokens, tokens, np.asarray(rollout)[None, None])
    fig, ax = plt.subplots(figsize=figure_size(1, 1, len(tokens), False), dpi=DPI)
    im = _draw(ax, view.weights[0, 0], view, _cmap(False), PowerNorm(0.5, 0.0, 1.0), len(tokens) <= LABELS_UP_TO,
               len(tokens) <= LABELS_UP_TO, len(tokens) <= NUMBERS_UP_TO, 9.0)
    ax.set_xlabel("input token")
    ax.set_ylabel("top-layer position")
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03, label="share of the input")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    return save_figure(fig, path, dpi=DPI)
