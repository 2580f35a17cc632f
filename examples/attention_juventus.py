"""Seed 000, question 1: self-attention resolves what "they" refers to.

Exercise (paraphrased). Two sentences differ in one word:
    "Juventus lost from Ajax because they were too strong"   ("they" = Ajax)
    "Juventus lost from Ajax because they were too weak"     ("they" = Juventus)
Every word is a 2-D vector. Keys and queries are W_K x and W_Q x with
W_K = W_Q = [[1, 0], [0, 1], [0, 0]] (2-D word -> 3-D key/query), values are W_V x with W_V = I_2.
Apply attention twice (the output of the first pass is the input of the second) and compare
which words the query "they" attends to in the two sentences.

The word vectors. The extracted seed text lost part of the vector table: it shows nine complete
vectors and a fragment "...1]" for ten words. The unambiguous ones are Juventus = [1, 0],
Ajax = [-1, 0], they = [0, 1] and zeros for "lost", "from", "because", "were". We read the rest as
    too = [0, 0],   strong = [-1, 1],   weak = [1, 1]
(the minus sign of "strong" is the part the extraction dropped). The first coordinate is a
"which team" axis (+1 Juventus, -1 Ajax); the second is shared by "they" and the adjective.
If "too" is read as [0, 1] instead, every conclusion below is unchanged (see the tests).

Scaling. The seed only says "apply softmax". We use the Transformer's scaled dot product
softmax(Q K^T / sqrt(d_k)) V with d_k = 3, i.e. `lmforge.reference.scaled_dot_product_attention`,
because that is the attention of the course (Vaswani et al.). Dividing by sqrt(3) is only a softmax
temperature: it never changes the order of the weights of a row, and the unscaled variant
(`scaled=False`) gives the same answer.

Answer (scaled, numbers printed by main()):
- Pass 1. "they" = [0, 1] is orthogonal to both team vectors, so it gives Juventus and Ajax the same
  weight (0.095 each); it attends most to itself and to the adjective (0.169 each). Its output is
  pulled along the adjective: [-0.169, 0.337] for "strong", [+0.169, 0.337] for "weak".
- Pass 2. The new "they" now has a team coordinate, so the tie breaks: in the "strong" sentence
  Ajax gets 0.113 against 0.107 for Juventus; in the "weak" sentence Juventus gets 0.113 against
  0.107 for Ajax. One pass cannot resolve the reference; two can, which is why the seed asks for two.
The largest weight of "they" still goes to the adjective (0.117): it shares the second coordinate.
Among the two candidate antecedents, the one "they" attends to is Ajax for "strong" and Juventus
for "weak", as the sentences mean.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference import scaled_dot_product_attention

W_Q = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # (3, 2): 2-D word -> 3-D query
W_K = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # (3, 2): 2-D word -> 3-D key
W_V = np.eye(2)  # (2, 2): values are the words themselves

CONTEXT = ["Juventus", "lost", "from", "Ajax", "because", "they", "were", "too"]
VECTORS = {
    "Juventus": [1.0, 0.0],
    "lost": [0.0, 0.0],
    "from": [0.0, 0.0],
    "Ajax": [-1.0, 0.0],
    "because": [0.0, 0.0],
    "they": [0.0, 1.0],
    "were": [0.0, 0.0],
    "too": [0.0, 0.0],
    "strong": [-1.0, 1.0],
    "weak": [1.0, 1.0],
}
THEY = CONTEXT.index("they")  # 5


def sentence(adjective: str) -> list[str]:
    return [*CONTEXT, adjective]


def embed(words: list[str], vectors: dict[str, list[float]] = VECTORS) -> np.ndarray:
    """Stack the word vectors: (N, 2)."""
    return np.array([vectors[w] for w in words])


def self_attention(x: np.ndarray, scaled: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One pass: queries, keys and values from the same words. Returns (output (N, 2), weights (N, N))."""
    q = x @ W_Q.T  # (N, 3)
    k = x @ W_K.T  # (N, 3)
    v = x @ W_V.T  # (N, 2)
    if not scaled:
        q = q * np.sqrt(q.shape[-1])  # cancels the 1/sqrt(d_k) inside the reference
    return scaled_dot_product_attention(q, k, v)


def attend_twice(
    adjective: str, scaled: bool = True, vectors: dict[str, list[float]] = VECTORS
) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(output, weights) of pass 1, (output, weights) of pass 2]; pass 2 reads pass 1's output."""
    x = embed(sentence(adjective), vectors)  # (N, 2)
    passes = []
    for _ in range(2):
        out, weights = self_attention(x, scaled)
        passes.append((out, weights))
        x = out
    return passes


def antecedent(adjective: str, scaled: bool = True, vectors: dict[str, list[float]] = VECTORS) -> str:
    """The team that "they" attends to more after the second pass."""
    weights = attend_twice(adjective, scaled, vectors)[1][1][THEY]  # (N,)
    teams = ["Juventus", "Ajax"]
    return max(teams, key=lambda team: weights[CONTEXT.index(team)])


def main() -> None:
    np.set_printoptions(precision=3, suppress=True)
    print("Reading of the garbled vectors: Juventus=[1,0] Ajax=[-1,0] they=[0,1] strong=[-1,1] weak=[1,1],")
    print("all other words [0,0]. Scaled dot product, d_k = 3.")
    for adjective in ["strong", "weak"]:
        words = sentence(adjective)
        print(f"\nSentence: {' '.join(words)}")
        print("           " + " ".join(f"{w[:8]:>8}" for w in words))
        for i, (out, weights) in enumerate(attend_twice(adjective), start=1):
            row = " ".join(f"{p:8.3f}" for p in weights[THEY])
            print(f"pass {i} they {row}   -> they = {out[THEY].round(3)}")
        print(f"'they' attends more to {antecedent(adjective)} than to the other team")
        unscaled = antecedent(adjective, scaled=False)
        print(f"(unscaled dot product gives the same: {unscaled})")


if __name__ == "__main__":
    main()
