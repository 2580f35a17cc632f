"""Seed 001, problem 6: one merged J x J matrix can replace a head's query and key matrices.

Exercise (paraphrased). A head scores token t1 against token t2 with
    alpha[t1, t2] = softmax_t2( (W_Q h_t1) . (W_K h_t2) / sqrt(I) ),   W_Q, W_K: (I, J), I < J.
(a) Find a matrix W~ of shape (J, J) such that alpha[t1, t2] = softmax_t2( h_t1^T W~ h_t2 ).
(b) How many parameters does W~ have per head, compared with W_Q and W_K together?

Answer.
(a) (W_Q h1) . (W_K h2) = h1^T W_Q^T W_K h2, so   W~ = W_Q^T W_K / sqrt(I)
    (in Einstein notation W~[k, j1, j2] = W_Q[k, i, j1] W_K[k, i, j2] / sqrt(I)).
    main() checks in float64 that both forms give the same attention to 1e-12.
(b) W_Q and W_K: 2 I J parameters per head; W~: J^2. They are equal when I = J / 2; for I < J/2 the
    factored form is smaller. For a BERT-base head (J = 768, I = 64): 2*64*768 = 98,304 against
    768^2 = 589,824, six times more. W~ has rank at most I, so merging adds no expressive power
    either: the factorisation is a cheap low-rank parametrisation of the same bilinear form.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference import scaled_dot_product_attention, softmax


def merged_matrix(w_q: np.ndarray, w_k: np.ndarray) -> np.ndarray:
    """W~ = W_Q^T W_K / sqrt(I) for W_Q, W_K of shape (I, J); returns (J, J)."""
    i = w_q.shape[0]
    return w_q.T @ w_k / np.sqrt(i)


def attention_both_ways(n_tokens: int, j: int, i: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Attention weights (N, N) of one head, computed with (W_Q, W_K) and with W~."""
    rng = np.random.default_rng(seed)
    h = rng.normal(size=(n_tokens, j))  # (N, J) token representations L[t, J]
    w_q = rng.normal(size=(i, j)) / np.sqrt(j)  # (I, J)
    w_k = rng.normal(size=(i, j)) / np.sqrt(j)  # (I, J)
    _, factored = scaled_dot_product_attention(h @ w_q.T, h @ w_k.T, h @ w_k.T)  # (N, N)
    merged = softmax(h @ merged_matrix(w_q, w_k) @ h.T)  # (N, N)
    return factored, merged


def parameter_counts(j: int, i: int) -> tuple[int, int]:
    """(W_Q and W_K together, W~) parameters per head."""
    return 2 * i * j, j * j


def main() -> None:
    j, i = 768, 64
    factored, merged = attention_both_ways(n_tokens=8, j=j, i=i)
    diff = float(np.abs(factored - merged).max())
    assert diff < 1e-12
    print(f"one head, J={j}, I={i}, 8 tokens, float64")
    print(f"max |softmax(Q K^T / sqrt(I)) - softmax(H W~ H^T)| = {diff:.1e} (< 1e-12)")
    two_ij, j_sq = parameter_counts(j, i)
    print(f"W_Q and W_K: 2*I*J = {two_ij:,} parameters per head")
    print(f"W~         : J^2   = {j_sq:,} parameters per head ({j_sq / two_ij:.0f}x more)")
    print(f"equal when I = J/2: 2*{j // 2}*{j} = {parameter_counts(j, j // 2)[0]:,} = {j}^2")


if __name__ == "__main__":
    main()
