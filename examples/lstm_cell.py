"""Seed 000, question 9 (optional): the cell state c_t and the output h_t of an LSTM.

Exercise (paraphrased). A figure of one LSTM cell gives the previous cell state c_{t-1} and the
values of the forget gate f_t, the input gate i_t, the candidate C~_t and the output gate o_t;
compute c_t and h_t (the gate activations themselves need not be recomputed).

The figure's numbers are not in the extracted seed text, so we pick clear values of our own
(two units):
    c_{t-1} = [0.5, -1.0], f_t = [0.9, 0.2], i_t = [0.6, 0.8], C~_t = [0.4, -0.5], o_t = [0.7, 0.3]

Answer.
    c_t = f_t * c_{t-1} + i_t * C~_t = [0.45 + 0.24, -0.2 - 0.4]            = [0.69, -0.6]
    h_t = o_t * tanh(c_t)            = [0.7 * tanh(0.69), 0.3 * tanh(-0.6)] = [0.4186, -0.1611]
(* is the element-wise product.) The forget gate keeps 90% of the first unit's memory and 20% of
the second's; the input gate writes most of the candidate; the output gate decides how much of the
squashed memory becomes visible as h_t.

main() also runs one full step from x_t, h_{t-1}, c_{t-1} and weights with `reference.lstm_cell`,
which first computes the gates from z = W [h_{t-1}; x_t] + b (PyTorch's order i, f, g, o).
"""

from __future__ import annotations

import numpy as np

from lmforge.reference import lstm_cell, lstm_state_update

C_PREV = np.array([0.5, -1.0])
GATES = {
    "f": np.array([0.9, 0.2]),  # forget gate f_t
    "i": np.array([0.6, 0.8]),  # input gate i_t
    "g": np.array([0.4, -0.5]),  # candidate C~_t
    "o": np.array([0.7, 0.3]),  # output gate o_t
}


def from_gates() -> tuple[np.ndarray, np.ndarray]:
    """(c_t, h_t) from the given gate values (the exercise)."""
    c = lstm_state_update(C_PREV, GATES)  # (J,)
    h = GATES["o"] * np.tanh(c)  # (J,)
    return c, h


def full_step(seed: int = 0) -> dict[str, np.ndarray]:
    """One LSTM step from x_t (I=3), h_{t-1}, c_{t-1} (J=2) and seeded weights W (4J, J+I), b (4J,)."""
    rng = np.random.default_rng(seed)
    n_in, n_hidden = 3, 2
    x = np.array([1.0, -0.5, 0.25])  # (I,)
    h_prev = np.array([0.1, -0.2])  # (J,)
    w = rng.normal(size=(4 * n_hidden, n_hidden + n_in)) * 0.5  # (4J, J+I) acting on [h; x]
    b = np.zeros(4 * n_hidden)  # (4J,)
    h, c, gates = lstm_cell(x, h_prev, C_PREV, w, b)
    return {"x": x, "h_prev": h_prev, "c_prev": C_PREV, "w": w, "b": b, "h": h, "c": c, **gates}


def main() -> None:
    np.set_printoptions(precision=4, suppress=True)
    print("(values chosen here: the seed's figure is missing from the extracted text)")
    for name, label in [("f", "f_t"), ("i", "i_t"), ("g", "C~_t"), ("o", "o_t")]:
        print(f"{label:5} = {GATES[name]}")
    print(f"c_t-1 = {C_PREV}")
    c, h = from_gates()
    print(f"c_t = f_t*c_t-1 + i_t*C~_t = {c}")
    print(f"h_t = o_t*tanh(c_t)       = {h}")

    print("\nOne full step with reference.lstm_cell (I=3, J=2, seeded W, b=0):")
    step = full_step()
    for name in ["x", "h_prev", "c_prev"]:
        print(f"{name:6} = {step[name]}")
    print(f"W (4J, J+I) =\n{step['w']}")
    for name, label in [("i", "i_t"), ("f", "f_t"), ("g", "C~_t"), ("o", "o_t")]:
        print(f"{label:5} = {step[name]}")
    print(f"c_t   = {step['c']}")
    print(f"h_t   = {step['h']}")


if __name__ == "__main__":
    main()
