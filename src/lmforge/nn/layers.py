"""The position-wise feed-forward network and the Transformer layer, one class for every model type.

A layer is self-attention, an optional cross-attention over an encoder's output, and a feed-forward
network, each wrapped in a residual connection and a layer normalisation. ``norm_position`` says where
the normalisation sits:

    'post' (Vaswani et al. 2017, BERT):   x = LN(x + Sublayer(x))
    'pre'  (GPT-2, most modern LMs):      x = x + Sublayer(LN(x))

Post-LN is what the original paper draws; pre-LN trains more stably for deep stacks because the
residual path stays an identity (it needs a final LN after the last layer, which the models add).

``norm`` picks the normalisation (LayerNorm or RMSNorm, ``lmforge.nn.norms``) and ``activation`` the
feed-forward non-linearity, including the two of the modern recipe (docs/modern.md):

    relu2   (So et al. 2021, Primer):      FFN(x) = relu(x W_1ᵀ)² W_2ᵀ
    swiglu  (Shazeer 2020, LLaMA):         FFN(x) = (silu(x W_gᵀ) ⊙ x W_uᵀ) W_2ᵀ,   W_1 = [W_g; W_u]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.nn.attention import MultiHeadAttention
from lmforge.nn.cache import KVCache
from lmforge.nn.norms import make_norm
from lmforge.nn.positions import Angles, RotaryEmbedding

Activation = Literal["relu", "gelu", "gelu_tanh", "relu2", "swiglu"]
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "relu2", "swiglu")
GATED = ("swiglu",)  # activations that take two projections of x (a gate and a value)
NormPosition = Literal["post", "pre"]


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


def activation_fn(name: str):
    """'relu' (Vaswani), 'gelu' (BERT, exact erf form), 'gelu_tanh' (GPT-2's approximation), 'relu2' (Primer).

    'swiglu' is not a function of one input: ``FeedForward`` builds it from silu and a second projection.
    """
    if name == "relu":
        return F.relu
    if name == "gelu":
        return F.gelu
    if name == "gelu_tanh":
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "relu2":
        return relu_squared
    if name == "swiglu":
        return F.silu
    raise ValueError(f"unknown activation {name!r}: choose {', '.join(ACTIVATIONS)}")


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1ᵀ + b_1) W_2ᵀ + b_2, the same two-layer network at every position.

    Gated ('swiglu'): fc1 holds [W_g; W_u], shape (2 d_ff, d_model), and FFN(x) = (silu(g) ⊙ u) W_2ᵀ + b_2
    with [g, u] = x W_1ᵀ + b_1. Three d_model × d_ff matrices instead of two: keep the parameter count of
    a plain FFN with d_ff = 2/3 of its width.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: Activation = "relu", dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        self.gated = activation in GATED
        self.fc1 = nn.Linear(d_model, 2 * d_ff if self.gated else d_ff, bias=bias)  # W_1: (d_ff or 2 d_ff, d_model)
        self.fc2 = nn.Linear(d_ff, d_model, bias=bias)  # W_2: (d_model, d_ff)
        self.act = activation_fn(activation)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)  # (B, T, d_ff) or (B, T, 2 d_ff)
        if self.gated:
            gate, value = h.chunk(2, dim=-1)  # (B, T, d_ff) each
            h = self.act(gate) * value
        else:
            h = self.act(h)
        return self.fc2(self.dropout(h))  # (B, T, d_model)


class LayerOutput(NamedTuple):
    hidden: torch.Tensor  # (B, T, d_model)
    self_attention: torch.Tensor | None  # (B, H, T, T) when weights are asked for
    cross_attention: torch.Tensor | None  # (B, H, T, S) when weights are asked for and the layer has cross-attention


class LayerCache(NamedTuple):
    self_attention: KVCache
    cross_attention: KVCache | None


@dataclass
class SublayerInputs:
    """What a layer's attention sublayers read besides x, for one forward call, and the weights they return."""

    memory: torch.Tensor | None  # (B, S, d_model) encoder output, for cross-attention
    key_padding_mask: torch.Tensor | None  # (B, T_total) True = a real key
    memory_padding_mask: torch.Tensor | None  # (B, S)
    attn_mask: torch.Tensor | None  # broadcastable to (B, H, T, T_total)
    need_weights: bool
    cache: LayerCache | None
    positions: torch.Tensor | Angles | None  # (T,) or (B, T), or their angles, for rotary positions
    self_weights: torch.Tensor | None = None  # (B, H, T, T_total), filled when need_weights
    cross_weights: torch.Tensor | None = None  # (B, H, T, S)


@dataclass(frozen=True)
class LayerConfig:
    """The settings of one ``TransformerLayer``, checked once when the layer is built.

    d_model, n_heads, d_ff: widths and head count.
    n_kv_heads: key/value heads shared by groups of n_heads // n_kv_heads query heads (default n_heads).
    norm_position: 'post' (Vaswani, BERT) or 'pre' (GPT-2); see the module docstring.
    activation: 'relu', 'gelu', 'gelu_tanh', 'relu2' or 'swiglu'.
    dropout: on each sublayer's output before the residual sum; attention_dropout on the weights.
    causal: the self-attention is masked so position t sees only positions <= t (decoders).
    cross_attention: add a sublayer attending over an encoder's output (Vaswani's decoder).
    eps: normalisation epsilon (1e-5 in torch and GPT-2, 1e-12 in BERT), QK-norm's too.
    d_qk, d_v: per-head query/key and value widths (default d_model / n_heads).
    bias: biases on every projection and on the LayerNorms (False: no additive terms anywhere).
    norm: 'layernorm' or 'rmsnorm' (``lmforge.nn.norms``).
    qk_norm: RMSNorm on each head's queries and keys (``lmforge.nn.attention``).

    >>> LayerConfig(64, 4, 256, norm_position="pre").norm_position
    'pre'
    """

    d_model: int
    n_heads: int
    d_ff: int
    norm_position: NormPosition = "post"
    activation: Activation = "relu"
    dropout: float = 0.0
    attention_dropout: float = 0.0
    causal: bool = False
    cross_attention: bool = False
    eps: float = 1e-5
    d_qk: int | None = None
    d_v: int | None = None
    bias: bool = True
    norm: str = "layernorm"
    qk_norm: bool = False
    n_kv_heads: int | None = None

    def __post_init__(self) -> None:
        if self.norm_position not in ("post", "pre"):
            raise ValueError(f"norm_position must be 'post' or 'pre', not {self.norm_position!r}")

    def attention(self, **more: Any) -> dict[str, Any]:
        """The keyword arguments of this layer's ``MultiHeadAttention``s (self and cross share them)."""
        return dict(d_qk=self.d_qk, d_v=self.d_v, bias=self.bias, dropout=self.attention_dropout,
                    qk_norm=self.qk_norm, eps=self.eps, n_kv_heads=self.n_kv_heads, **more)


class TransformerLayer(nn.Module):
    """Self-attention (+ cross-attention) + feed-forward, each in a residual connection, post- or pre-LN.

    Pre-LN (GPT-2), the two lines of nanoGPT's Block (three with cross-attention):

        x = x + attend(norm1(x))                 attend: self-attention, then dropout
        x = x + feed_forward(norm2(x))

    Post-LN (Vaswani, BERT): x = norm1(x + attend(x)); x = norm2(x + feed_forward(x)).

    ``TransformerLayer(d_model, n_heads, d_ff, **settings)`` takes the fields of ``LayerConfig`` as
    keywords, and ``rotary``, the rotary position embedding the model's layers share.

    >>> layer = TransformerLayer(8, 2, 16, norm_position="pre", causal=True).eval()
    >>> out = layer(torch.randn(1, 5, 8), need_weights=True)
    >>> out.hidden.shape, out.self_attention.shape
    (torch.Size([1, 5, 8]), torch.Size([1, 2, 5, 5]))
    """

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, rotary: RotaryEmbedding | None = None, **settings: Any
    ) -> None:
        super().__init__()
        self.config = c = LayerConfig(d_model, n_heads, d_ff, **settings)
        self.pre_norm = c.norm_position == "pre"
        self.self_attn = MultiHeadAttention(d_model, n_heads, **c.attention(causal=c.causal, rotary=rotary))
        self.norm1 = make_norm(c.norm, d_model, c.eps, c.bias)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, **c.attention(cross=True)) if c.cross_attention else None
        self.norm_cross = make_norm(c.norm, d_model, c.eps, c.bias) if c.cross_attention else None
        # Dropout on the FFN's output only (self.dropout below), as in Vaswani, BERT and GPT-2: not inside it.
        self.ffn = FeedForward(d_model, d_ff, c.activation, 0.0, c.bias)
        self.norm2 = make_norm(c.norm, d_model, c.eps, c.bias)
        self.dropout = nn.Dropout(c.dropout)

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        memory_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        need_weights: bool = False,
        cache: LayerCache | None = None,
        positions: torch.Tensor | Angles | None = None,
    ) -> LayerOutput:
        """x: (B, T, d_model); memory: (B, S, d_model) encoder output; masks True = may attend.

        attn_mask: broadcastable to (B, H, T, T); cache: from ``new_cache``; positions: (T,) or (B, T) for rotary.
        """
        inputs = SublayerInputs(memory, key_padding_mask, memory_padding_mask, attn_mask, need_weights, cache,
                                positions)
        x = self.pre_ln(x, inputs) if self.pre_norm else self.post_ln(x, inputs)  # (B, T, d_model)
        return LayerOutput(x, inputs.self_weights, inputs.cross_weights)

    def pre_ln(self, x: torch.Tensor, inputs: SublayerInputs) -> torch.Tensor:
        """x + f(LN(x)) for each sublayer f (GPT-2, modern LMs). x: (B, T, d_model)."""
        x = x + self.attend(self.norm1(x), inputs)
        if self.cross_attn is not None:
            x = x + self.attend_memory(self.norm_cross(x), inputs)
        return x + self.feed_forward(self.norm2(x))

    def post_ln(self, x: torch.Tensor, inputs: SublayerInputs) -> torch.Tensor:
        """LN(x + f(x)) for each sublayer f (Vaswani, BERT). x: (B, T, d_model)."""
        x = self.norm1(x + self.attend(x, inputs))
        if self.cross_attn is not None:
            x = self.norm_cross(x + self.attend_memory(x, inputs))
        return self.norm2(x + self.feed_forward(x))

    # -- the three sublayers, each returning its dropped-out output (B, T, d_model) -----------------------
    def attend(self, h: torch.Tensor, inputs: SublayerInputs) -> torch.Tensor:
        """Self-attention over h; keeps the weights in ``inputs`` when they are asked for."""
        cache = inputs.cache.self_attention if inputs.cache is not None else None
        out = self.self_attn(h, key_padding_mask=inputs.key_padding_mask, attn_mask=inputs.attn_mask,
                             need_weights=inputs.need_weights, cache=cache, positions=inputs.positions)
        inputs.self_weights = out.weights  # (B, H, T, S) or None
        return self.dropout(out.output)

    def attend_memory(self, h: torch.Tensor, inputs: SublayerInputs) -> torch.Tensor:
        """Cross-attention from h to the memory; keeps the weights in ``inputs`` when they are asked for."""
        cache = inputs.cache.cross_attention if inputs.cache is not None else None
        out = self.cross_attn(h, inputs.memory, key_padding_mask=inputs.memory_padding_mask,
                              need_weights=inputs.need_weights, cache=cache)
        inputs.cross_weights = out.weights  # (B, H, T, S) or None
        return self.dropout(out.output)

    def feed_forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.ffn(h))

    def new_cache(self, batch: int, max_len: int, memory_len: int, dtype: torch.dtype,
                  device: torch.device) -> LayerCache:
        """Empty caches for incremental decoding: self-attention up to max_len, cross-attention memory_len."""
        cross = self.cross_attn.new_cache(batch, memory_len, dtype, device) if self.cross_attn else None
        return LayerCache(self.self_attn.new_cache(batch, max_len, dtype, device), cross)

