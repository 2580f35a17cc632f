"""Seed 001 problem 5: self-attention over an (X, Y) grid, and what 2-D positions make it see.

Exercise (paraphrased). (a) Rewrite the self-attention equations with the time index t replaced by two
spatial indices x and y. (b) With logarithmic-time summations, what is the parallel run time of the
spatial self-attention layer in terms of X, Y, J and K?

Answers. (a) α[k, x1, y1, x2, y2] = softmax over (x2, y2) of Query[k, x1, y1, U] Key[k, x2, y2, U] and
Out[k, x, y, I] = Σ_{x', y'} α[k, x, y, x', y'] Value[k, x', y', I] (``lmforge.reference.attention2d``).
(b) The projections are sums over J (O(log J)), the scores sums over U < J, the normaliser and the
weighted sum are sums over the X·Y cells (O(log XY)); the K heads run side by side: O(log XY + log J).

The picture: one query cell's attention α[x1, y1, :, :] over an 8 x 8 grid whose cells hold nothing but
their position (one head, W^Q = W^K = β I, so the score is β P(x1, y1) · P(x2, y2) / sqrt(D)):
  left    2-D sinusoids (x in the first half of the channels, y in the second): the weight falls off with
          the distance in x and in y alike: the four neighbours of the query get the same weight;
  middle  1-D sinusoids of the flattened index x·Y + y: left and right neighbours are close, the cells
          above and below are Y positions away, and the end of the previous row counts as a neighbour;
  right   2-D positions plus content: the query and the cells of a 'shape' carry one extra feature;
          the query attends to the shape, the shape's near cells most (position still counts).

    LMFORGE_OUT=docs/img python examples/attention_2d.py       # writes attention2d_query_map.png there
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from lmforge.nn import SpatialSelfAttention
from lmforge.nn.attention2d import sinusoidal_positions_2d
from lmforge.nn.positions import sinusoidal_table

N_X, N_Y, D = 8, 8, 16
QUERY = (3, 4)
BETA = 4.0  # sharpens the maps: scores are β P·P' / sqrt(D)


def out_dir() -> Path:
    """Pictures go to $LMFORGE_OUT, default out/examples/ at the repository root (gitignored)."""
    path = Path(os.environ.get("LMFORGE_OUT", Path(__file__).resolve().parents[1] / "out" / "examples"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def position_attention(d: int, beta: float = BETA) -> SpatialSelfAttention:
    """One head with W^Q = W^K = β I and W^V = W_o = I, no biases: α compares the inputs themselves."""
    layer = SpatialSelfAttention(d, n_heads=1, bias=False).double()
    eye = torch.eye(d, dtype=torch.float64)
    with torch.no_grad():
        layer.attn.in_proj.weight.copy_(torch.cat([beta * eye, eye, eye]))  # [W_q; W_k; W_v]
        layer.attn.out_proj.weight.copy_(eye)
    return layer.eval()


def flattened_positions(n_x: int, n_y: int, d: int) -> torch.Tensor:
    """(X, Y, D): the 1-D sinusoid of the row-major index x·Y + y (what a flattened sequence would get)."""
    return sinusoidal_table(n_x * n_y, d).reshape(n_x, n_y, d)


def shape_cells(n_x: int = N_X, n_y: int = N_Y) -> torch.Tensor:
    """(X, Y) boolean: a ring of cells around (2, 2) plus a bar in the bottom rows: the 'object'."""
    cells = torch.zeros(n_x, n_y, dtype=torch.bool)
    cells[1:4, 1:4] = True
    cells[2, 2] = False
    cells[6, 2:7] = True
    return cells


@torch.no_grad()
def attention_maps(query: tuple[int, int] = QUERY) -> dict[str, torch.Tensor]:
    """α[query, :, :] (X, Y) for the three grids of the picture."""
    layer = position_attention(D + 1)
    pad = torch.zeros(N_X, N_Y, 1, dtype=torch.float64)
    content = shape_cells()[..., None].double() * 3.0  # (X, Y, 1): the feature both query and shape carry
    grids = {
        "2-D sinusoids": torch.cat([sinusoidal_positions_2d(N_X, N_Y, D), pad], -1),
        "1-D sinusoids of x·Y + y": torch.cat([flattened_positions(N_X, N_Y, D), pad], -1),
        "2-D sinusoids + content": torch.cat([sinusoidal_positions_2d(N_X, N_Y, D), content], -1),
    }
    grids["2-D sinusoids + content"][query[0], query[1], -1] = 3.0  # the query looks for that feature
    maps = {}
    for name, h in grids.items():
        _, alpha = layer(h[None], need_weights=True)  # (1, 1, X, Y, X, Y)
        maps[name] = alpha[0, 0, query[0], query[1]]  # (X, Y)
    return maps


def save_picture(path: Path, query: tuple[int, int] = QUERY) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    maps = attention_maps(query)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.8), dpi=90)
    for ax, (name, alpha) in zip(axes, maps.items(), strict=True):
        image = ax.imshow(alpha.numpy(), cmap="viridis", interpolation="nearest")
        ax.scatter([query[1]], [query[0]], marker="x", color="red", s=60)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel("y")
        ax.set_ylabel("x")
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(f"attention of query cell (x, y) = {query} over an {N_X} x {N_Y} grid "
                 f"(one head, W^Q = W^K = {BETA:g} I, D = {D})", fontsize=11)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    maps = attention_maps()
    x, y = QUERY
    for name, alpha in maps.items():
        neighbours = {"x-1": alpha[x - 1, y], "x+1": alpha[x + 1, y], "y-1": alpha[x, y - 1], "y+1": alpha[x, y + 1]}
        shown = ", ".join(f"{k} {float(v):.3f}" for k, v in neighbours.items())
        print(f"{name:26s} self {float(alpha[x, y]):.3f}; {shown}; sum {float(alpha.sum()):.6f}")
    print(f"parallel depth (problem 5b): O(log XY + log J) = O(log2 {N_X * N_Y} + log2 {D}) "
          f"= {math.log2(N_X * N_Y) + math.log2(D):.0f} summation levels")
    print(f"picture saved: {save_picture(out_dir() / 'attention2d_query_map.png')}")


if __name__ == "__main__":
    main()
