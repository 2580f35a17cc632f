"""Positional encodings (NumPy): the sinusoids of Vaswani et al. and one-hot positions (seed 002)."""

from __future__ import annotations

import numpy as np


def sinusoidal_positions(n_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """PE(pos, 2i) = sin(pos / base^(2i/d)),  PE(pos, 2i+1) = cos(pos / base^(2i/d)).  Shape (n_positions, d).

    >>> sinusoidal_positions(2, 4).round(4)
    array([[0.    , 1.    , 0.    , 1.    ],
           [0.8415, 0.5403, 0.01  , 1.    ]])
    """
    pos = np.arange(n_positions, dtype=np.float64)[:, None]  # (N, 1)
    two_i = np.arange(0, d, 2, dtype=np.float64)[None, :]  # (1, ceil(d/2))
    angle = pos / base ** (two_i / d)  # (N, ceil(d/2))
    pe = np.zeros((n_positions, d))
    pe[:, 0::2] = np.sin(angle)
    pe[:, 1::2] = np.cos(angle[:, : d // 2])
    return pe


def one_hot_positions(n_positions: int, d: int) -> np.ndarray:
    """p_i = e_i: orthogonal only while n_positions <= d (seed 002, 1a and 1c).

    >>> one_hot_positions(2, 3)
    array([[1., 0., 0.],
           [0., 1., 0.]])
    """
    if n_positions > d:
        raise ValueError(f"{n_positions} one-hot positions need d >= {n_positions}, got d = {d}")
    return np.eye(n_positions, d)
