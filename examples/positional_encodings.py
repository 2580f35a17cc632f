"""Seed 002 exercise 1(a), 1(c) and the sinusoids of seed 003: what makes a positional encoding.

Exercises (paraphrased).
1(a) N positions get embeddings p_1..p_N in R^D with p_i . p_j = 0 for i != j. Is that always
     possible? If not, what is required?
1(c) Is one-hot encoding (p_i = e_i) a good positional embedding? What goes wrong?
Seed 003 shows the sinusoidal encoding PE(pos, 2i) = sin(pos / n^(2i/d)), PE(pos, 2i+1) =
cos(pos / n^(2i/d)), n = 10000, as a heatmap for d = 128 and N = 50.

Answers.
1(a) No. Non-zero orthogonal vectors are linearly independent, and R^D holds at most D of them:
     it needs N <= D, so the maximum sequence length is bounded by the model width.
     (`one_hot_positions(N, D)` raises for N > D.)
1(c) One-hot positions are orthogonal (their Gram matrix is the identity) but a poor choice:
     they need D >= N, so the maximum length is fixed forever and each position occupies its own
     dimension; every two positions are equally far apart (p_i . p_j = 0 whether |i - j| is 1 or 100),
     so nothing tells the model that neighbours are close; a position never seen in training
     (a long sequence) has an untrained dimension; added to word vectors they overwrite one
     coordinate of the word embedding at each position.
Sinusoids fix this: for every offset k there is one matrix M_k (a rotation of each (sin, cos) pair
by the angle k * w_i) with PE(pos + k) = M_k PE(pos) for all pos, so a relative shift is a linear
map; and PE(pos) . PE(pos + k) = sum_i cos(k w_i) depends only on the offset k, not on pos.
main() verifies both numerically and saves the heatmap to $LMFORGE_OUT/sinusoidal_pe.png.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from lmforge.reference import one_hot_positions, sinusoidal_positions

BASE = 10000.0


def out_dir() -> Path:
    """Pictures go to $LMFORGE_OUT, default out/examples/ at the repository root (gitignored)."""
    default = Path(__file__).resolve().parents[1] / "out" / "examples"
    path = Path(os.environ.get("LMFORGE_OUT", default))
    path.mkdir(parents=True, exist_ok=True)
    return path


def one_hot_gram(n: int, d: int) -> np.ndarray:
    """Gram matrix P P^T (N, N) of one-hot positions; raises ValueError when N > D."""
    p = one_hot_positions(n, d)  # (N, D)
    return p @ p.T


def frequencies(d: int, base: float = BASE) -> np.ndarray:
    """w_i = 1 / base^(2i/d) for i = 0..d/2-1: (d/2,)."""
    return 1.0 / base ** (np.arange(0, d, 2) / d)


def shift_matrix(k: int, d: int, base: float = BASE) -> np.ndarray:
    """M_k (d, d), block diagonal: rotates each (sin, cos) pair by k * w_i, so PE(pos+k) = M_k PE(pos).

    sin(a + b) = sin a cos b + cos a sin b,   cos(a + b) = cos a cos b - sin a sin b.
    """
    m = np.zeros((d, d))
    for i, w in enumerate(frequencies(d, base)):
        c, s = np.cos(k * w), np.sin(k * w)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = [[c, s], [-s, c]]
    return m


def shift_error(k: int, n: int = 50, d: int = 128) -> float:
    """max over pos of |PE(pos + k) - M_k PE(pos)|."""
    pe = sinusoidal_positions(n + k, d)  # (N + k, d)
    shifted = pe[:n] @ shift_matrix(k, d).T  # (N, d): row pos is M_k PE(pos)
    return float(np.abs(pe[k:] - shifted).max())


def offset_dot_products(n: int = 50, d: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(Gram matrix PE PE^T (N, N), the closed form sum_i cos((q - p) w_i) (N, N))."""
    pe = sinusoidal_positions(n, d)  # (N, d)
    offsets = np.arange(n)[None, :] - np.arange(n)[:, None]  # (N, N): q - p
    closed = np.cos(offsets[..., None] * frequencies(d)).sum(-1)  # (N, N)
    return pe @ pe.T, closed


def save_heatmap(path: Path, n: int = 50, d: int = 128) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pe = sinusoidal_positions(n, d)  # (N, d)
    fig, ax = plt.subplots(figsize=(6, 3), dpi=90)
    image = ax.imshow(pe, cmap="RdBu", aspect="auto", vmin=-1, vmax=1, interpolation="nearest")
    ax.set_xlabel("embedding index")
    ax.set_ylabel("position")
    ax.set_title(f"Sinusoidal positional encoding, d={d}, N={n}, n=10000")
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    print("One-hot positions (seed 002, 1a and 1c)")
    for n, d in [(4, 6), (6, 6)]:
        identity = np.array_equal(one_hot_gram(n, d), np.eye(n))
        print(f"N={n} D={d}: Gram matrix P P^T is the identity: {identity}")
    try:
        one_hot_gram(7, 6)
    except ValueError as err:
        print(f"N=7 D=6: impossible, ValueError: {err}")
    print("every pair of one-hot positions has dot product 0: neighbours look as far apart as strangers")

    print("\nSinusoidal positions (seed 003), d=128, N=50")
    for k in (1, 5, 20):
        print(f"PE(pos+{k}) = M_{k} PE(pos) for every pos: max error {shift_error(k):.1e}")
    gram, closed = offset_dot_products()
    error = np.abs(gram - closed).max()
    print(f"PE(p).PE(q) = sum_i cos((q-p) w_i), depends only on q-p: max error {error:.1e}")
    print(f"e.g. offset 1: {closed[0, 1]:.3f} at p=0 and {gram[30, 31]:.3f} at p=30")
    path = save_heatmap(out_dir() / "sinusoidal_pe.png")
    print(f"heatmap saved: {path}")


if __name__ == "__main__":
    main()
