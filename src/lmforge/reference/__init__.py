"""The equations of the course in NumPy float64, with no torch: the oracle every torch module is tested against."""

from lmforge.reference.attention import (
    causal_mask,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from lmforge.reference.layers import encoder_layer, feed_forward, gelu, gelu_tanh, layer_norm, relu
from lmforge.reference.positions import one_hot_positions, sinusoidal_positions
from lmforge.reference.rnn import lstm_cell, lstm_state_update, sigmoid

__all__ = [
    "causal_mask",
    "encoder_layer",
    "feed_forward",
    "gelu",
    "gelu_tanh",
    "layer_norm",
    "lstm_cell",
    "lstm_state_update",
    "multi_head_attention",
    "one_hot_positions",
    "relu",
    "scaled_dot_product_attention",
    "sigmoid",
    "sinusoidal_positions",
    "softmax",
    "split_heads",
]
