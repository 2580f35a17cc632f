"""PyTorch building blocks shared by every model: one attention, one layer, configured."""

from lmforge.nn.attention import AttentionOutput, MultiHeadAttention, attention_scores_softmax, causal_mask
from lmforge.nn.cache import KVCache
from lmforge.nn.layers import FeedForward, LayerCache, LayerOutput, TransformerLayer, activation_fn
from lmforge.nn.positions import (
    LearnedPositions,
    RotaryEmbedding,
    SinusoidalPositions,
    scale_embedding,
    sinusoidal_table,
)

__all__ = [
    "AttentionOutput",
    "FeedForward",
    "KVCache",
    "LayerCache",
    "LayerOutput",
    "LearnedPositions",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositions",
    "TransformerLayer",
    "activation_fn",
    "attention_scores_softmax",
    "causal_mask",
    "scale_embedding",
    "sinusoidal_table",
]
