"""The LSTM cell of Hochreiter & Schmidhuber, in the gate notation of seed 000 question 9 (NumPy)."""

from __future__ import annotations

import numpy as np


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))  # stable for large |x|


def lstm_cell(
    x: np.ndarray, h_prev: np.ndarray, c_prev: np.ndarray, w: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """One LSTM step. Returns (h_t, c_t, gates).

    With z = W [h_{t-1}; x_t] + b split in four equal parts (PyTorch's order i, f, g, o):
        i_t = sigmoid(z_i)    input gate          f_t = sigmoid(z_f)   forget gate
        g_t = tanh(z_g)       candidate C~_t      o_t = sigmoid(z_o)   output gate
        c_t = f_t * c_{t-1} + i_t * g_t
        h_t = o_t * tanh(c_t)
    x: (..., I), h_prev and c_prev: (..., J), w: (4J, J + I), b: (4J,).
    """
    z = np.concatenate([h_prev, x], axis=-1) @ w.T + b  # (..., 4J)
    z_i, z_f, z_g, z_o = np.split(z, 4, axis=-1)
    gates = {"i": sigmoid(z_i), "f": sigmoid(z_f), "g": np.tanh(z_g), "o": sigmoid(z_o)}
    c = lstm_state_update(c_prev, gates)
    return gates["o"] * np.tanh(c), c, gates


def lstm_state_update(c_prev: np.ndarray, gates: dict[str, np.ndarray]) -> np.ndarray:
    """c_t = f_t * c_{t-1} + i_t * C~_t, from gate values already computed (seed 000 Q9's figure).

    >>> lstm_state_update(np.array([1.0]), {"f": np.array([0.5]), "i": np.array([1.0]), "g": np.array([0.2])})
    array([0.7])
    """
    return gates["f"] * c_prev + gates["i"] * gates["g"]
