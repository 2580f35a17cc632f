"""Seed 002, computer assignment 1(c)-(d): the same weights with one head and with three heads.

Exercise (paraphrased). Take N = 5 inputs of D = 6 dimensions and one set of weights W_q, W_k, W_v.
Run multi-head self-attention with H = 1 and with H = 3 (the identity as the output transformation;
for H = 3 head h uses the h-th block of D/H = 2 rows of each weight matrix). Print the outputs and
the attention weights of both. Why do they differ although the weights are the same? What happens
to the output when the first two inputs swap places?

Answer.
- H = 1 computes one softmax over full 6-D query-key dot products, scaled by 1/sqrt(6).
  H = 3 splits the same projections into three 2-D slices: each head scores with only its own two
  coordinates (scaled by 1/sqrt(2)) and has its own softmax, so it gets its own attention pattern,
  and each group of two output columns is mixed by its own head's weights. The sum of the three
  heads' scores is sqrt(3) times the single-head score, but softmax is not linear, so the weights
  (and the outputs) are different. With W_o = I only the final mixing is trivial, not the heads.
- Swapping inputs 1 and 2 swaps rows 1 and 2 of the output and nothing else: without positional
  encodings self-attention is permutation equivariant, f(P x) = P f(x). The attention matrix is
  permuted on both sides, P A P^T.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference import multi_head_attention

N, D = 5, 6


def make_inputs(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (N, D) and W_q, W_k, W_v (D, D), drawn with a fixed seed."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(N, D))  # (N, D)
    w_q, w_k, w_v = (rng.normal(size=(D, D)) for _ in range(3))  # (D, D) each
    return x, w_q, w_k, w_v


def attend(x: np.ndarray, n_heads: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Self-attention of x with the seeded weights and W_o = I: (output (N, D), weights (H, N, N))."""
    _, w_q, w_k, w_v = make_inputs(seed)
    return multi_head_attention(x, w_q, w_k, w_v, np.eye(D), n_heads)


SWAP = [1, 0, 2, 3, 4]  # the permutation P: inputs 1 and 2 trade places


def swap_first_two(a: np.ndarray) -> np.ndarray:
    """P a: rows 1 and 2 of a (N, ...) swapped."""
    return a[SWAP]


def main() -> None:
    np.set_printoptions(precision=3, suppress=True, linewidth=110)
    x, *_ = make_inputs()
    print(f"N={N} D={D}, x and W_q, W_k, W_v ~ N(0, 1) with seed 0, W_o = I")
    results = {h: attend(x, h) for h in (1, 3)}
    for h, (out, weights) in results.items():
        print(f"\nH={h}: output (N, D)")
        print(out)
        for i, a in enumerate(weights):
            print(f"H={h}: attention weights of head {i + 1} (N, N)")
            print(a)
    gap = np.abs(results[1][0] - results[3][0]).max()
    print(f"\nmax |output(H=1) - output(H=3)| = {gap:.3f}: the outputs differ")
    print("why: each of the 3 heads scores with a 2-dim slice of q and k (scale 1/sqrt(2)) and has")
    print("its own softmax; H=1 uses one softmax over the full 6-dim dot product (scale 1/sqrt(6)).")

    for h in (1, 3):
        out, weights = results[h]
        out_swapped, weights_swapped = attend(swap_first_two(x), h)
        rows = np.allclose(out_swapped, swap_first_two(out))
        permuted = np.allclose(weights_swapped, weights[:, SWAP][:, :, SWAP])  # P A P^T per head
        print(f"\nH={h}, inputs 1 and 2 swapped: output rows 1 and 2 swap, rest unchanged: {rows}")
        print(out_swapped)
        print(f"H={h}: attention weights become P A P^T: {permuted}")
    print("self-attention without positions is permutation equivariant: f(Px) = P f(x)")


if __name__ == "__main__":
    main()
