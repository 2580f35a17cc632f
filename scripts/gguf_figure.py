"""docs/img/gguf_permutation.png: the rows of one attention head's W_q in Hugging Face's order and in the order
llama.cpp's converter writes them to a GGUF file (``interop.gguf.permute``; reading undoes it).

    .venv/bin/python scripts/gguf_figure.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from lmforge.interop.gguf import permute

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "gguf_permutation.png"


def main() -> None:
    d = 8  # one head of 8 rows: pairs (j, j + 4) rotate together in the rotate-half layout
    rows = np.arange(d).reshape(d, 1)
    written = permute(rows, heads=1).ravel()
    fig, ax = plt.subplots(figsize=(7.5, 2.6))
    colors = plt.get_cmap("tab10")
    for position, row in enumerate(range(d)):
        ax.add_patch(plt.Rectangle((position, 1), 0.9, 0.8, color=colors(row % (d // 2)), alpha=0.8))
        ax.text(position + 0.45, 1.4, f"{row}", ha="center", va="center", fontsize=10)
    for position, row in enumerate(written):
        ax.add_patch(plt.Rectangle((position, 0), 0.9, 0.8, color=colors(row % (d // 2)), alpha=0.8))
        ax.text(position + 0.45, 0.4, f"{row}", ha="center", va="center", fontsize=10)
        source = int(np.where(np.arange(d) == row)[0][0])
        ax.annotate("", xy=(position + 0.45, 0.82), xytext=(source + 0.45, 0.98),
                    arrowprops=dict(arrowstyle="->", color="gray", lw=0.8))
    ax.text(-0.2, 1.4, "Hugging Face, lmforge\n(rotate half: j with j + d/2)", ha="right", va="center", fontsize=9)
    ax.text(-0.2, 0.4, "GGUF (llama.cpp)\n(adjacent pairs)", ha="right", va="center", fontsize=9)
    ax.set(xlim=(-3.6, d), ylim=(-0.1, 1.9), title="Rows of one head of W_q: a colour is one rotated pair")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(OUT, dpi=130)
    print(OUT)


if __name__ == "__main__":
    main()
