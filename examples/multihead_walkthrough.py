"""Seed 000, question 2: every matrix of multi-head self-attention, with its shape and formula.

Exercise (paraphrased). For a sequence of length S, embedding size E, H heads, query/key size M_QK
per head and value size M_V per head, sketch the parameter matrices and the intermediate results of
multi-head self-attention, with their dimensions, the non-parametric steps (slicing, dot product,
softmax, concatenation) and the formula of each step.

Answer (rows are positions, weights in nn.Linear convention (out, in), so a projection is X W^T):
    X                                   (S, E)
    W_Q^h, W_K^h                        (M_QK, E)   per head h = 1..H
    W_V^h                               (M_V, E)    per head
    Q_h = X W_Q^h^T,  K_h = X W_K^h^T   (S, M_QK)
    V_h = X W_V^h^T                     (S, M_V)
    scores_h = Q_h K_h^T / sqrt(M_QK)   (S, S)      dot products, scaled
    A_h = softmax_row(scores_h)         (S, S)      each row sums to 1
    head_h = A_h V_h                    (S, M_V)
    concat = [head_1 ... head_H]        (S, H*M_V)  concatenation along features
    W_O                                 (E, H*M_V)
    output = concat W_O^T               (S, E)
Stacking W_Q^1..W_Q^H on top of each other gives one (H*M_QK, E) matrix; slicing its rows is the
same as slicing the columns of X W_Q^T, which is how `lmforge.reference.multi_head_attention`
does it. main() runs the walkthrough for S=4, E=8, H=2, M_QK=3, M_V=5 and checks the result equals
the reference with the stacked weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lmforge.reference import multi_head_attention, scaled_dot_product_attention, softmax


@dataclass
class Walkthrough:
    """Every named matrix of the walkthrough, in the order of the computation."""

    steps: list[tuple[str, str, np.ndarray]]  # (name, formula, value)
    output: np.ndarray  # (S, E)
    weights: np.ndarray  # (H, S, S)
    stacked: dict[str, np.ndarray]  # w_q, w_k, w_v, w_o as the reference takes them


def walkthrough(
    s: int = 4, e: int = 8, h: int = 2, m_qk: int = 3, m_v: int = 5, seed: int = 0
) -> Walkthrough:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(s, e))  # (S, E)
    w_q = [rng.normal(size=(m_qk, e)) for _ in range(h)]  # H x (M_QK, E)
    w_k = [rng.normal(size=(m_qk, e)) for _ in range(h)]  # H x (M_QK, E)
    w_v = [rng.normal(size=(m_v, e)) for _ in range(h)]  # H x (M_V, E)
    w_o = rng.normal(size=(e, h * m_v))  # (E, H*M_V)

    steps: list[tuple[str, str, np.ndarray]] = [("X", "input embeddings", x)]
    heads, weights = [], []
    for i in range(h):
        n = i + 1
        q = x @ w_q[i].T  # (S, M_QK)
        k = x @ w_k[i].T  # (S, M_QK)
        v = x @ w_v[i].T  # (S, M_V)
        scores = q @ k.T / np.sqrt(m_qk)  # (S, S)
        head, a = scaled_dot_product_attention(q, k, v)  # (S, M_V), (S, S)
        assert np.allclose(a, softmax(scores))
        steps += [
            (f"W_Q^{n}", "parameter", w_q[i]),
            (f"W_K^{n}", "parameter", w_k[i]),
            (f"W_V^{n}", "parameter", w_v[i]),
            (f"Q_{n}", f"X W_Q^{n}^T", q),
            (f"K_{n}", f"X W_K^{n}^T", k),
            (f"V_{n}", f"X W_V^{n}^T", v),
            (f"scores_{n}", f"Q_{n} K_{n}^T / sqrt({m_qk})", scores),
            (f"A_{n}", f"softmax over each row of scores_{n}", a),
            (f"head_{n}", f"A_{n} V_{n}", head),
        ]
        heads.append(head)
        weights.append(a)
    concat = np.concatenate(heads, axis=1)  # (S, H*M_V)
    output = concat @ w_o.T  # (S, E)
    steps += [
        ("concat", " | ".join(f"head_{i + 1}" for i in range(h)), concat),
        ("W_O", "parameter", w_o),
        ("output", "concat W_O^T", output),
    ]
    stacked = {
        "w_q": np.concatenate(w_q),  # (H*M_QK, E)
        "w_k": np.concatenate(w_k),  # (H*M_QK, E)
        "w_v": np.concatenate(w_v),  # (H*M_V, E)
        "w_o": w_o,  # (E, H*M_V)
    }
    return Walkthrough(steps, output, np.stack(weights), stacked)


def check_against_reference(w: Walkthrough, n_heads: int) -> float:
    """Largest absolute difference between the walkthrough and reference.multi_head_attention."""
    x = w.steps[0][2]
    p = w.stacked
    out, weights = multi_head_attention(x, p["w_q"], p["w_k"], p["w_v"], p["w_o"], n_heads)
    return float(max(np.abs(out - w.output).max(), np.abs(weights - w.weights).max()))


def main() -> None:
    np.set_printoptions(precision=2, suppress=True, linewidth=110)
    s, e, h, m_qk, m_v = 4, 8, 2, 3, 5
    print(f"S={s} E={e} H={h} M_QK={m_qk} M_V={m_v}")
    w = walkthrough(s, e, h, m_qk, m_v)
    for name, formula, value in w.steps:
        print(f"\n{name} {value.shape}  = {formula}")
        print(value)
    n_params = sum(p.size for p in w.stacked.values())
    print(f"\nparameters: 2*H*M_QK*E + H*M_V*E + E*H*M_V = {n_params}")
    diff = check_against_reference(w, h)
    print(f"max |walkthrough - reference.multi_head_attention| = {diff:.1e}")
    print("matches reference:", diff < 1e-12)


if __name__ == "__main__":
    main()
