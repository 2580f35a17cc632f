"""Seed 000, questions 7 and 8: cross-modal search, and cross-attention built from its parts.

Exercise 7 (paraphrased). Two images are represented by the rows of I (2 x 4) and three sentences
by the rows of T (3 x 2). Learned projections W_i (4 x 3) and W_t (2 x 3) map both into a shared
3-D space. Which sentence annotates each image best? Show the computation.
Exercise 8 (paraphrased). To update the image representations by cross-attention over the
sentences instead, which parts of the search can be reused and which must be added?

Answer 7. Project, then score every (image, sentence) pair by the dot product:
    I W_i = [[-1.23, -0.15,  0.89],         T W_t = [[-0.96,  0.42,  0.24],
             [ 0.03, -0.07, -0.05]]                  [ 0.92, -0.39, -0.48],
                                                     [-0.56,  0.20,  1.04]]
    S = (I W_i)(T W_t)^T = [[ 1.3314, -1.5003,  1.5844],
                            [-0.0702,  0.0789, -0.0828]]
Image 1 -> sentence 3, image 2 -> sentence 2. Cosine similarity (which ignores the lengths of the
projected vectors; image 2's is small) picks the same sentences.

Answer 8. The projections are reused as the query map (W_i, images ask) and the key map (W_t,
sentences answer), and the dot-product scores as attention scores. To be added: a value
projection of the text (what is copied, not only how well it matches), a softmax over the
sentences (scaled by 1/sqrt(3)) to turn scores into weights, an output projection back to the image
width (4), and a residual connection (usually with layer norm) that adds the result to the image
representation. main() does this with `reference.multi_head_attention(images, ..., memory=text)`;
its attention weights peak on the same sentences the search found.
"""

from __future__ import annotations

import numpy as np

from lmforge.reference import multi_head_attention

I = np.array([[0.2, -1.5, 0.6, 0.3], [-0.4, -0.5, 1.2, -0.1]])  # (2 images, 4)
T = np.array([[0.9, 0.3], [-0.8, -0.1], [0.3, -0.5]])  # (3 sentences, 2)
W_I = np.array([[0.6, 0.3, -0.2], [1.3, 0.3, -0.6], [0.8, 0.2, -0.3], [0.4, 0.4, 0.7]])  # (4, 3)
W_T = np.array([[-1.2, 0.5, 0.8], [0.4, -0.1, -1.6]])  # (2, 3)


def project() -> tuple[np.ndarray, np.ndarray]:
    """Images (2, 3) and sentences (3, 3) in the shared space."""
    return I @ W_I, T @ W_T


def dot_scores() -> np.ndarray:
    """S[image, sentence] = <image, sentence> in the shared space: (2, 3)."""
    images, sentences = project()
    return images @ sentences.T


def cosine_scores() -> np.ndarray:
    """Dot products of the unit-length projections: (2, 3)."""
    images, sentences = project()
    images = images / np.linalg.norm(images, axis=1, keepdims=True)
    sentences = sentences / np.linalg.norm(sentences, axis=1, keepdims=True)
    return images @ sentences.T


def best_sentences(scores: np.ndarray) -> list[int]:
    """1-based index of the best sentence for each image."""
    return [int(j) + 1 for j in scores.argmax(axis=1)]


def cross_attention(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images attend to sentences; returns (updated images (2, 4), weights (1, 2, 3)).

    Query map W_i and key map W_t come from the search (as nn.Linear weights, (out, in) = W^T);
    the value map (3, 2) and the output map (4, 3) are new, random here (they would be learned).
    """
    rng = np.random.default_rng(seed)
    w_v = rng.normal(size=(3, 2)) * 0.5  # (d_v, 2): text -> value
    w_o = rng.normal(size=(4, 3)) * 0.5  # (4, d_v): back to the image width
    update, weights = multi_head_attention(I, W_I.T, W_T.T, w_v, w_o, n_heads=1, memory=T)  # (2, 4)
    return I + update, weights  # residual connection


def main() -> None:
    np.set_printoptions(precision=4, suppress=True)
    images, sentences = project()
    print("I W_i (images in the shared space, 2 x 3):")
    print(images)
    print("T W_t (sentences in the shared space, 3 x 3):")
    print(sentences)
    scores = dot_scores()
    print("dot-product scores S = (I W_i)(T W_t)^T (image x sentence):")
    print(scores)
    for i, j in enumerate(best_sentences(scores), start=1):
        print(f"image {i}: best sentence {j} (score {scores[i - 1, j - 1]:.4f})")
    cosine = cosine_scores()
    print("cosine similarities, for comparison:")
    print(cosine)
    print(f"best sentences by cosine: {best_sentences(cosine)}")

    print("\nQ8: cross-attention, images (queries through W_i) attend to sentences (keys through W_t)")
    updated, weights = cross_attention()
    print("attention weights softmax(S / sqrt(3)) (image x sentence):")
    print(weights[0])
    print(f"most attended sentence per image: {best_sentences(weights[0])}")
    print("updated images I + W_o (weights @ V) (2 x 4):")
    print(updated)
    print("reused: W_i (queries), W_t (keys), dot-product scores; added: values, softmax, W_o, residual")


if __name__ == "__main__":
    main()
