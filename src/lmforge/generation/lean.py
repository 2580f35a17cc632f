"""The lean decoding step: one new token a row through a pre-LN decoder, in about 18 torch calls a layer.

The model's own forward (``decoder_step`` in runners/eager.py) is the readable reference: every layer builds its
mask, looks up its rotation, splits heads, writes its cache through ``SlotKV`` and goes through the modules of
``TransformerLayer`` and ``MultiHeadAttention`` — about 62 aten calls a layer, 1,874 a token at SmolLM2's 30
layers, where on a CPU the Python and dispatch work of those calls costs as much as the matrix products. This step
computes the same thing (to float rounding: tests/test_lean_step.py) for the case that decoding runs most, one
token a row over the slots' caches, with everything that does not depend on the layer done once a step:

    once a step   embeddings; the rotation's cos and sin of every row's position, laid out per head (the values'
                  heads turn by 0); the attention bias of every row (0 for its columns <= its length, -inf
                  after: no boolean mask, no masked_fill a layer); every layer's view of the cache, made by
                  one ``unbind``; the buffers the layers write into, and their views
    a layer       x = x + W_o attend(norm1(x))                     (R, D)
                  x = x + W_2 (silu(g) ⊙ u),  [g, u] = W_1 norm2(x)

and attend, for h (R, D) and r = H / H_kv query heads a key/value head:

    heads   = (h W_qkvᵀ).view(R, H + 2 H_kv, d)                   queries, keys, values of the new token
    turned  = heads ⊙ cos + roll(heads, d/2) ⊙ sin±                 rotary in two calls (rotate_half = roll with
                                                                    the sine's first half negated)
    cache[part, row, head, length] = turned[:, H:]                  keys and values written by one index_put_
    scores  = bias + scale · q Kᵀ                                    q (R, H_kv, r, d), K (R, H_kv, C, d)
    heads   = softmax(scores) V                                     into (R, H_kv, r, d) = (R, H d) in place

A row's bits never depend on its neighbours: every call is per row (elementwise, per-row softmax, products whose
rows do not depend on the row count: the runner's packed products on a CPU). ``add_product(linear, x, residual)``
is the residual sum after a product, in one call: ``addmm`` with plain products, one oneDNN call with the CPU
runner's packed ones (runners/cpu.py).

On a CPU (``native``, the CPU runner's choice, where lmforge's C kernels build: nn/kernels.py) the RMSNorm and
the attention above (rotation, cache write, softmax over the row's columns) are one step_kernels.c call each; and
when every product is a quantized layer in kernels.c's layout (RMSNorm, SwiGLU: the Llama family at ``--dtype
int8 | int4``) the whole layer stack is one call (``native_layers``), the same pieces in the same order without
Python between them.
These layer-by-layer lines stay the readable statement of what that call computes (tests compare the two).

What fits (``fits``): a ``Decoder`` with rotary or learned positions, RMSNorm or LayerNorm, any activation, no
QK-norm, the keys and values of every layer of one shape. Others step through the model's forward.
"""

from __future__ import annotations

import ctypes
import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.generation.slots import SlotCaches, arange
from lmforge.models.decoder import Decoder
from lmforge.nn import kernels
from lmforge.nn.layers import TransformerLayer
from lmforge.nn.norms import RMSNorm
from lmforge.nn.quant import QuantizedLinear


def fits(model: nn.Module, caches: SlotCaches | None = None) -> bool:
    """Whether the lean step computes this model's decoding step (else the model's forward does): a decoder whose
    layers' keys and values share one shape (``caches``, when made: held in one buffer; a cache of half floats
    beside a float32 model only where step_kernels.c reads it, on the CPU)."""
    if not isinstance(model, Decoder) or (caches is not None and caches.buffer is None):
        return False
    weight = next(p for p in model.parameters() if p.is_floating_point())
    if caches is not None and caches.buffer.dtype != weight.dtype and not kernels_read(caches.buffer, weight.dtype):
        return False
    attention = [layer.self_attn for layer in model.layers]
    if len({(a.n_kv_heads, a.d_qk, a.d_v) for a in attention}) != 1 or attention[0].d_qk != attention[0].d_v:
        return False
    return all(a.q_norm is None and a.d_qk % 2 == 0 for a in attention)


def kernels_read(buffer: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether step_kernels.c can read this cache beside a model of ``dtype``: float32 activations, a float32 or
    float16 cache in the CPU's memory, the kernels built here."""
    return kernels.library() is not None and buffer.device.type == "cpu" and dtype == torch.float32 \
        and buffer.dtype in (torch.float32, torch.float16)


_TRANSPOSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> Wᵀ, a view made once


def transposed(linear: nn.Linear) -> torch.Tensor:
    """Wᵀ (in, out) of a layer, the view made again when its weight is other memory (replaced, or converted).
    Inside ``torch.compile`` the plain view (free in a graph; the cache's pointer checks cannot be traced)."""
    if torch.compiler.is_compiling():
        return linear.weight.t()
    w, held = linear.weight, _TRANSPOSED.get(linear)
    if held is None or held.data_ptr() != w.data_ptr() or held.dtype != w.dtype or held.shape[::-1] != w.shape:
        held = _TRANSPOSED[linear] = w.detach().t()
    return held


def add_product(linear: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + linear(x) (R, out) in one call: ``addmm`` for an ``nn.Linear`` without bias (its Wᵀ viewed
    once), the quantized layer's own (it adds a residual in its product); else the two calls."""
    if type(linear) is nn.Linear and linear.bias is None and x.dim() == 2 and not torch.is_grad_enabled():
        return torch.addmm(residual, x, transposed(linear))
    if type(linear) is QuantizedLinear:
        return linear(x, residual)
    return residual + linear(x)


def normalize(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm or LayerNorm of x (R, D) in one call."""
    if isinstance(norm, nn.LayerNorm):
        return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return F.rms_norm(x, (x.shape[-1],), norm.weight, norm.eps)


def layer_parts(layer: TransformerLayer) -> tuple[nn.Module, ...]:
    """norm1, norm2, the attention, the feed-forward and its four products (in, out, fc1, fc2)."""
    attention, ffn = layer._modules["self_attn"], layer._modules["ffn"]
    return (layer._modules["norm1"], layer._modules["norm2"], attention, ffn, attention._modules["in_proj"],
            attention._modules["out_proj"], ffn._modules["fc1"], ffn._modules["fc2"])


def native_float(layer: nn.Module) -> bool:
    """A float32 ``nn.Linear`` whose float_kernels.c copy (``kernels.pack_float``) the CPU runner has attached."""
    packed = layer.__dict__.get("packed")
    return type(layer) is nn.Linear and packed is not None and packed.dim() == 3


def watched(model: Decoder) -> list[tuple[dict, str, Any]]:
    """(table, key, value) of every module and tensor a ``kernels.Layer`` description depends on: the layers, their
    parts, the norms' gains and each product's weight, scales and bias, as the modules' own tables hold them. A
    step checks each entry still holds its value (fast: a dict lookup each); one replaced (another module, or a
    tensor re-made, as ``model.float()`` re-makes a product's scales) must never leave the C side reading freed
    memory."""
    entries = [(model.layers._modules, key, layer) for key, layer in model.layers._modules.items()]
    for layer in model.layers:
        parts = layer_parts(layer)
        for parent in (layer, *parts[2:4]):  # the layer, its attention and feed-forward: their modules
            entries += [(parent._modules, key, module) for key, module in parent._modules.items()]
        for part in parts[:2] + parts[4:]:  # the norms and the products: their tensors
            entries += [(table, key, t) for table in (part._parameters, part._buffers) for key, t in table.items()]
            if isinstance(part, nn.Linear):  # the CPU runner's float32 copy, attached for the step
                entries.append((part.__dict__, "packed", part.__dict__.get("packed")))
    return entries


def unchanged(watch: tuple[tuple, ...]) -> bool:
    """Whether each of ``watched``'s tables, given as (tables, keys, values), still holds its value at its key: the
    lookups and identity tests made in C (``map``), not a Python loop (SmolLM2's 660 entries: 181 -> 118 µs a
    token, its tables out of the CPU's caches after the layers' products have streamed the weights through)."""
    tables, keys, values = watch
    return all(map(operator.is_, map(dict.get, tables, keys), values))


class StepTensors(NamedTuple):
    """What every layer of one step reads or writes: made once a step."""

    cos: torch.Tensor  # (R, H + 2 H_kv, d): cos of each row's angles on query and key heads, 1 on value heads
    sin: torch.Tensor  # (R, H + 2 H_kv, d): [-sin, sin] halves on query and key heads, 0 on value heads
    bias: torch.Tensor  # (R, 1, 1, C): 0 for a row's columns <= its length, -inf after
    at: tuple[torch.Tensor, ...]  # where each row's new keys and values go in a layer's (2, S, H_kv, C, d)
    turned: torch.Tensor  # (R, H + 2 H_kv, d): the rotated heads, written by every layer in turn
    queries: torch.Tensor  # (R, H_kv, r, d): a view of turned's query heads, grouped by key/value head
    new_kv: torch.Tensor  # (R, 2 H_kv, d): a view of turned's key and value heads
    heads: torch.Tensor  # (R, H_kv, r, d): the attention's output, written by every layer in turn
    concat: torch.Tensor  # (R, H d): the same memory, as the output projection reads it


class LeanStep:
    """``lean(tokens, lengths, columns, first)``: the next-token logits (R, V) of rows [first, first + R) of the
    slots, each decoding one token at its column ``lengths[b]`` and attending to its first ``columns`` columns
    (see the module docstring). ``add_product``: the residual sum of a product in one call (``addmm`` by default)."""

    def __init__(self, model: Decoder, caches: SlotCaches,
                 add_product: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = add_product,
                 native: bool = False) -> None:
        self.model, self.buffer, self.add_product = model, caches.buffer, add_product
        self._stack: tuple[list, ctypes.Array | None] | None = None  # ``native_layers``: (watched, description)
        # the attention as one fused call (F.scaled_dot_product_attention with the bias as its mask) instead of the
        # four above: fewer kernels on a GPU, to be chosen by measurement there (bench/gpu_step.py --attention)
        self.fused = False
        attention = model.layers[0].self_attn
        self.h, self.h_kv, self.d = attention.n_heads, attention.n_kv_heads, attention.d_qk
        self.scale = attention.scale
        weight = next(p for p in model.parameters() if p.is_floating_point())  # the model's float dtype and device
        heads = self.h + 2 * self.h_kv
        # the index of a layer's new keys and values, (part, head) of each of the 2 H_kv heads: part 0 keys, 1 values
        self.part = torch.arange(2, device=weight.device).repeat_interleave(self.h_kv)[None]  # (1, 2 H_kv)
        self.kv_head = torch.arange(self.h_kv, device=weight.device).repeat(2)[None]  # (1, 2 H_kv)
        self.turns = torch.arange(heads, device=weight.device) < self.h + self.h_kv  # (H + 2 H_kv,) rotated heads
        self.layer_at = torch.arange(len(model.layers), device=weight.device).unbind(0)  # L x (): each layer's index
        self.cos = self.sin = None
        if model.rotary is not None:  # (N + 1, d) tables in the model's dtype; row N turns by 0 (the values)
            cos, sin = (table.to(weight.dtype) for table in model.rotary.tables(weight.dtype))
            sin = torch.cat([-sin[:, : self.d // 2], sin[:, self.d // 2:]], dim=-1)  # rotate_half's signs
            self.cos = torch.cat([cos, torch.ones_like(cos[:1])])
            self.sin = torch.cat([sin, torch.zeros_like(sin[:1])])
        self.zero, self.minus_inf = (torch.full((), v, dtype=weight.dtype, device=weight.device)
                                     for v in (0.0, float("-inf")))
        # step_kernels.c's RMSNorm and step attention (a CPU runner's choice): one call each instead of torch's several;
        # it reads the rotation tables at each row's column unchecked: every column of the cache must have a row
        self.native = native and kernels_read(self.buffer, weight.dtype) \
            and (self.cos is None or self.cos.shape[0] > self.buffer.shape[-2])
        if self.buffer.dtype != weight.dtype and not self.native:  # torch's step would mix the two types
            raise ValueError(f"the lean step reads a {self.buffer.dtype} cache only through step_kernels.c")

    def __call__(self, tokens: torch.Tensor, lengths: torch.Tensor, columns: int, first: int = 0) -> torch.Tensor:
        """tokens, lengths (R,) -> logits (R, V)."""
        model, rows = self.model, tokens.shape[0]
        x = model.tok_emb(tokens)  # (R, D)
        if model.pos_emb is not None:
            x = x + F.embedding(lengths, model.pos_emb.embedding.weight)
        if self.native and (stack := self.native_layers()) is not None:  # every layer in one step_kernels.c call
            x = x.contiguous()
            eps = model.layers[0].norm1.eps  # every norm's (``native_layers``)
            kernels.decode_layers(x, stack, eps, self.h, self.cos, self.sin, lengths, self.buffer, first, self.scale)
            return model.head(self.normalize(model.norm_f, x))  # (R, V)
        if self.native:  # rotation, cache write and attention in one step_kernels.c call a layer
            out = x.new_empty(rows, self.h * self.d)  # (R, H d)
            targets = self.buffer.unbind(0)  # L x (2, S, H_kv, C_max, d): where each layer's keys and values go
            attends = [functools.partial(self.attend_native, target=target, lengths=lengths, first=first, out=out)
                       for target in targets]
        else:
            cache = self.buffer[:, :, first:first + rows, :, :columns]  # (L, 2, R, H_kv, C, d)
            keys = cache[:, 0].unbind(0) if self.fused else cache[:, 0].transpose(-1, -2).unbind(0)  # L x Kᵀ, or K
            values = cache[:, 1].unbind(0)  # L x (R, H_kv, C, d)
            t = self.step_tensors(lengths, columns, first)
            attends = [functools.partial(self.attend, k=k, v=v, layer_at=at, t=t)
                       for k, v, at in zip(keys, values, self.layer_at, strict=True)]
        for layer, attend in zip(model.layers, attends, strict=True):
            x = self.layer(layer, x, attend)
        return model.head(self.normalize(model.norm_f, x))  # (R, V)

    def native_layers(self) -> ctypes.Array | None:
        """step_kernels.c's description of the layers (``kernels.Layer``) where the whole stack can run in one call:
        every product a ``QuantizedLinear`` in kernels.c's layout or a float32 one with its float_kernels.c copy
        attached, RMSNorm gains of one eps, SwiGLU; else None.
        Made at the first step and kept with what it describes: a module or tensor replaced since makes it again."""
        if self._stack is not None and unchanged(self._stack[0]):
            return self._stack[1]
        held = [layer_parts(layer) for layer in self.model.layers]
        norms = [m for modules in held for m in modules[:2]]
        products = [m for modules in held for m in modules[4:]]
        fit = all(type(m) is RMSNorm and m.weight is not None and m.eps == norms[0].eps for m in norms) and \
            all((type(m) is QuantizedLinear and m.layout == "lmforge") or native_float(m) for m in products) and \
            all(modules[3].gated for modules in held) and self.model.pos_emb is None
        stack = None
        if fit:
            stack = (kernels.Layer * len(held))(*[kernels.Layer(
                n1.weight.data_ptr(), n2.weight.data_ptr(), *(kernels.product_of(m) for m in (qkv, out, up, down)))
                for n1, n2, _, _, qkv, out, up, down in held])
        self._stack = tuple(zip(*watched(self.model), strict=True)), stack  # (tables, keys, values)
        return stack

    def normalize(self, norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm or LayerNorm of x (R, D) in one call (``native``: step_kernels.c's RMSNorm)."""
        if self.native and type(norm) is RMSNorm and norm.weight is not None:
            return kernels.rms_norm(x, norm.weight, norm.eps)
        return normalize(norm, x)

    def step_tensors(self, lengths: torch.Tensor, columns: int, first: int) -> StepTensors:
        """The rotation, the bias, the cache index and the buffers of one step (shapes in ``StepTensors``)."""
        rows, device, dtype = lengths.shape[0], lengths.device, self.zero.dtype
        length = lengths[:, None]  # (R, 1)
        cos = sin = self.zero
        if self.cos is not None:  # row N of the tables (no turn) on the value heads
            position = torch.where(self.turns, length, self.cos.shape[0] - 1)  # (R, H + 2 H_kv)
            cos, sin = self.cos[position], self.sin[position]  # (R, H + 2 H_kv, d)
        visible = arange(columns, device)[None] <= length  # (R, C)
        bias = torch.where(visible, self.zero, self.minus_inf).view(rows, 1, 1, columns)
        slots = (arange(rows, device) if not first else torch.arange(first, first + rows, device=device))[:, None]
        turned = torch.empty(rows, self.h + 2 * self.h_kv, self.d, dtype=dtype, device=device)
        heads = torch.empty(rows, self.h * self.d, dtype=dtype, device=device)
        return StepTensors(cos, sin, bias, (self.part, slots, self.kv_head, length), turned,
                           turned[:, : self.h].view(rows, self.h_kv, -1, self.d), turned[:, self.h:],
                           heads.view(rows, self.h_kv, -1, self.d), heads)

    def layer(self, layer: TransformerLayer, x: torch.Tensor, attend: Callable) -> torch.Tensor:
        """One pre-LN layer for x (R, D): nanoGPT's Block, each residual sum in the call of its product."""
        heads = attend(layer, self.normalize(layer.norm1, x))  # (R, H d)
        x = self.add_product(layer.self_attn.out_proj, heads, x)  # x + W_o attend(norm1(x))
        return self.add_product(layer.ffn.fc2, self.feed_forward(layer, self.normalize(layer.norm2, x)), x)

    def attend_native(self, layer: TransformerLayer, h: torch.Tensor, target: torch.Tensor, lengths: torch.Tensor,
                      first: int, out: torch.Tensor) -> torch.Tensor:
        """``attend`` by step_kernels.c: the heads (R, H d) of h (R, D), the new keys and values written into target."""
        heads = layer.self_attn.in_proj(h).view(h.shape[0], -1, self.d)  # (R, H + 2 H_kv, d)
        kernels.decode_attention(heads, self.h, self.cos, self.sin, lengths, target, first, self.scale, out)
        return out

    def attend(self, layer: TransformerLayer, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               layer_at: torch.Tensor, t: StepTensors) -> torch.Tensor:
        """The attention heads (R, H d) of h (R, D) over the cached keys k (R, H_kv, d, C; ``fused``: (R, H_kv, C, d))
        and values v; the new keys and values written into the buffer at layer ``layer_at`` (a () index)."""
        heads = layer.self_attn.in_proj(h).view(t.turned.shape)  # (R, H + 2 H_kv, d)
        if self.cos is not None:  # x cos + rotate_half(x) sin, the value heads turned by 0
            torch.mul(heads, t.cos, out=t.turned)
            t.turned.addcmul_(heads.roll(self.d // 2, dims=-1), t.sin)
        else:
            t.turned.copy_(heads)
        # (R, 2 H_kv, d) at each row's column, written into the whole buffer by index (not into a view of a layer:
        # torch.compile then writes in place, where a view's write is compiled as a copy of the whole buffer)
        self.buffer.index_put_((layer_at, *t.at), t.new_kv)
        if self.fused:  # one call: q (R, H_kv, r, d) over K, V (R, H_kv, C, d), the bias as its mask
            return F.scaled_dot_product_attention(t.queries, k, v, attn_mask=t.bias, scale=self.scale).view(
                t.concat.shape)  # (R, H d)
        scores = torch.add(t.bias, torch.matmul(t.queries, k), alpha=self.scale)  # (R, H_kv, r, C)
        torch.matmul(scores.softmax(dim=-1), v, out=t.heads)  # (R, H_kv, r, d)
        return t.concat  # (R, H d)

    def feed_forward(self, layer: TransformerLayer, h: torch.Tensor) -> torch.Tensor:
        """act(h W_1ᵀ) (R, d_ff), or silu(g) ⊙ u for a gated one; W_2 is the residual's product."""
        ffn = layer.ffn
        hidden = ffn.fc1(h)  # (R, d_ff) or (R, 2 d_ff)
        if not ffn.gated:
            return ffn.act(hidden)
        gate, value = hidden.chunk(2, dim=-1)
        return ffn.act(gate) * value
