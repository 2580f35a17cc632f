"""PyTorch building blocks shared by every model: one attention, one layer, configured."""

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
