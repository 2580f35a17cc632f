"""The equations of the course in NumPy float64, with no torch: the oracle every torch module is tested against.

    attention.py      softmax, scaled dot-product and multi-head attention, causal masks
    gqa.py            grouped-query attention (Ainslie et al. 2023)
    layers.py         layer norm, GELU / ReLU, the feed-forward network, one Transformer encoder layer
    positions.py      sinusoidal and one-hot positions
    modern.py         the modern decoder's pieces: RMSNorm, rotary, QK-norm, ReLU² / SwiGLU, soft cap
    rnn.py            the LSTM cell in the gate notation of seed 000
    rnn_attention.py  additive (Bahdanau) and multiplicative (Luong) attention for RNN encoder-decoders
    quant.py          weight-only int8 / int4: the dequantized weights and their product
    cnn.py            the sentence CNN of seed 001 problem 3, index by index
    attention2d.py    spatial self-attention over an (x, y) grid (seed 001 problem 5)
"""

from lmforge.reference.attention import (
    causal_mask,
    multi_head_attention,
    scaled_dot_product_attention,
    softmax,
    split_heads,
)
from lmforge.reference.attention2d import spatial_self_attention
from lmforge.reference.cnn import embedding_layer, sentence_cnn, strided_convolution
from lmforge.reference.gqa import grouped_query_attention
from lmforge.reference.layers import encoder_layer, feed_forward, gelu, gelu_tanh, layer_norm, relu
from lmforge.reference.positions import one_hot_positions, sinusoidal_positions
from lmforge.reference.rnn import lstm_cell, lstm_state_update, sigmoid
from lmforge.reference.rnn_attention import additive_attention, attend, multiplicative_attention

__all__ = [
    "additive_attention",
    "attend",
    "causal_mask",
    "embedding_layer",
    "encoder_layer",
    "feed_forward",
    "gelu",
    "gelu_tanh",
    "grouped_query_attention",
    "layer_norm",
    "lstm_cell",
    "lstm_state_update",
    "multi_head_attention",
    "multiplicative_attention",
    "one_hot_positions",
    "relu",
    "scaled_dot_product_attention",
    "sentence_cnn",
    "sigmoid",
    "sinusoidal_positions",
    "softmax",
    "spatial_self_attention",
    "split_heads",
    "strided_convolution",
]
