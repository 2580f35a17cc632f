"""PyTorch building blocks shared by every model: one attention, one layer, configured. Plain modules: no device
branch and no backend trick (the decoding engine's CPU tricks attach from its runner, generation/runners/cpu.py).

    attention.py       MultiHeadAttention: self / cross / causal, grouped heads, the explicit and the fused path
    attention2d.py     2-D self-attention over a grid (the seed's image layer) and its positions
    cache.py           KVCache: a layer's keys and values while decoding
    kernels.py         lmforge's C kernels (kernels.c: int8 / int4 products; step_kernels.c: a decoding step's norm,
                       attention and layers; float_kernels.c: float32 products) built on this machine at first
                       use, loaded with ctypes
    layers.py          FeedForward, TransformerLayer (post-LN / pre-LN, optional cross-attention), LayerCache
    lora.py            LoRA and bottleneck adapters wrapped around nn.Linear layers in place
    loss.py            token losses (next-token cross-entropy, ignore index)
    lstm.py            LSTM and its cell (the roots: ELMo, RNN seq2seq)
    mix.py             ELMo's scalar mix of layers
    norms.py           LayerNorm / RMSNorm by name
    quant.py           weight-only int8 / int4 linear layers (CPU kernels) and quantize(model, kind)
    pooling.py         the mean of hidden states over the real tokens (a padding mask)
    positions.py       sinusoidal, learned and rotary positions
    rnn_attention.py   Bahdanau (additive) and Luong (multiplicative) attention
"""

from lmforge.nn.attention import AttentionOutput, MultiHeadAttention, attention_scores_softmax, causal_mask
from lmforge.nn.attention2d import SpatialSelfAttention, Transformer2D, Transformer2DLayer, sinusoidal_positions_2d
from lmforge.nn.cache import KVCache
from lmforge.nn.layers import FeedForward, LayerCache, LayerOutput, TransformerLayer, activation_fn
from lmforge.nn.lstm import LSTM, LSTMCell, LSTMOutput
from lmforge.nn.norms import RMSNorm, make_norm
from lmforge.nn.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    scale_embedding,
    sinusoidal_table,
)
from lmforge.nn.rnn_attention import AdditiveAttention, MultiplicativeAttention

__all__ = [
    "LSTM",
    "AdditiveAttention",
    "AttentionOutput",
    "FeedForward",
    "KVCache",
    "LSTMCell",
    "LSTMOutput",
    "LayerCache",
    "LayerOutput",
    "LearnedPositions",
    "MultiHeadAttention",
    "MultiplicativeAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "SpatialSelfAttention",
    "Transformer2D",
    "Transformer2DLayer",
    "TransformerLayer",
    "activation_fn",
    "attention_scores_softmax",
    "causal_mask",
    "make_norm",
    "scale_embedding",
    "sinusoidal_positions_2d",
    "sinusoidal_table",
]
