"""Slots: the fixed-shape KV cache a runner holds (generation/runners/), and the buckets that bound its shapes.

An engine holds S slots. Each attention layer keeps the keys and values of all of them in one buffer,
allocated once, never moved, never reshaped:

    keys, values   (S, H_kv, C, d)       C: the capacity, the longest text a slot may hold

A request owns one slot (one row) from its prefill to its last token. Two ways to write into it:

    prefill   the prompt (1, P_b) of one request into its row, columns [0, P_b); the attention sees only
              these keys (causal), exactly as the model run alone on the prompt.
    step      one new token for every row b of [0, S_b) at column lengths[b]; the attention reads columns
              [0, C_b) of those rows, and the caller's mask shows row b only its columns <= lengths[b].

S_b and C_b are *buckets*: the smallest of a few sizes that holds what the active requests need. A compiled step
is specialised to its shapes, so the compiled runner's buckets are few (4, 8, 16 rows; 64, 128, 256, ...
columns): one graph per (S_b, C_b), whatever mix of prompt lengths, output lengths and batch sizes arrives. An
eager runner compiles nothing, so its buckets are fine instead (``multiples``): rows exact or in multiples of 4,
prompts padded to a multiple of 8 tokens, columns to a multiple of 32, since each padded row or column is
computed for nothing.

Why rows never change a neighbour's answer: every row's keys, mask and positions are its own, attention is
computed per row, and the matrix products give each row the same bits whatever other rows it is stacked with.
The CPU runner gets that from packed products for float32 weights (runners/cpu.py: any row count, any thread
count), so its steps compute exactly their active rows. Products that are not packed keep to at least
``MIN_ROWS`` rows (below that, BLAS switches to a matrix-vector kernel with another summation order) and, eager,
to multiples of 4 rows on one thread (on 2 threads MKL splits some row counts between its threads otherwise,
and those rows' bits change; docs/benchmarks.md). An engine of one slot (``generate`` on one prompt) steps one
row: there is no neighbour to differ from.

``SlotKV`` speaks the attention's cache protocol (``nn/attention.py``: ``append``, ``keys_values``, ``length``):
the model's layers write and read it without knowing about slots.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from lmforge.nn.layers import LayerCache

MIN_ROWS = 4  # unpacked products: below 4 rows a row's logits depend on the batch size (BLAS kernels)


def buckets(smallest: int, largest: int) -> list[int]:
    """Powers of two from ``smallest`` up to ``largest`` (which always closes the list).

    >>> buckets(256, 1024), buckets(256, 600), buckets(256, 128)
    ([256, 512, 1024], [256, 512, 600], [128])
    """
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return [*sizes, largest]


def multiples(step: int, largest: int) -> list[int]:
    """Every multiple of ``step`` below ``largest``, then ``largest``: the fine buckets of an eager engine, whose
    shapes cost no compiled graph, so that only a few columns or rows of padding are computed.

    >>> multiples(8, 30), multiples(8, 4)
    ([8, 16, 24, 30], [4])
    """
    return [*range(step, largest, step), largest]


def arange(n: int, device: torch.device) -> torch.Tensor:
    """[0, n) on the device, made once per (n, device): the rows of a step bucket. Inside ``torch.compile`` made in
    the graph (a cached tensor is no help there, and its cache cannot be traced)."""
    return torch.arange(n, device=device) if torch.compiler.is_compiling() else _arange(n, device)


@functools.cache
def _arange(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device)


def upload(values: Sequence | torch.Tensor, device: torch.device, dtype: torch.dtype = torch.long,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """Host values (a list, a list of equal lists, or a CPU tensor) as a tensor on ``device`` (into ``out`` when
    given), without waiting for the device: on an accelerator through pinned memory and a non-blocking copy, queued
    behind the work already sent (a tensor made from host values straight on the device is copied from pageable memory,
    which waits for the device: a host sync). On a CPU (or the meta device) a plain tensor."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=dtype)
    if device.type == "cuda":
        host = host.pin_memory()
    if out is not None:
        return out.copy_(host, non_blocking=True)
    return host.to(device, non_blocking=True) if device.type != "cpu" else host


def bucket(size: int, sizes: Sequence[int]) -> int:
    """The smallest bucket that holds ``size``.

    >>> bucket(300, [256, 512, 1024])
    512
    """
    for b in sizes:
        if b >= size:
            return b
    raise ValueError(f"{size} exceeds the largest bucket {sizes[-1]}")


class SlotKV:
    """Keys and values of one attention layer for every slot: (S, H_kv, C, d_k) and (S, H_kv, C, d_v).

    The engine sets the mode before each model call (``prefill`` or ``step``); the layer then calls
    ``append`` with the new keys and values and attends over what it returns. Unwritten columns hold 0
    (never uninitialised memory, which could hold NaN: a masked column then adds 0 · 0).

    A cache of another float type than the model's (``kv_cache="fp16"``: half the memory, half the bytes a step
    reads) rounds each key and value once, when it is written; every attention, a prefill's over its own new keys
    too, reads them rounded and back in the model's type, so that a prompt prefilled whole, continued after a
    cached prefix, or decoded token by token sees the same numbers.
    """

    def __init__(self, slots: int, heads: int, capacity: int, d_k: int, d_v: int, dtype: torch.dtype,
                 device: torch.device, kv: torch.Tensor | None = None, compute: torch.dtype | None = None) -> None:
        """``kv``: (2, S, H_kv, C, d), this layer's part of ``SlotCaches.buffer``, to hold the keys and values in
        (else they get buffers of their own); ``compute``: the model's float type, when the cache's differs."""
        if kv is not None:
            self.k, self.v = kv.unbind(0)  # (S, H_kv, C, d) each, contiguous
        else:
            self.k = torch.zeros(slots, heads, capacity, d_k, dtype=dtype, device=device)
            self.v = torch.zeros(slots, heads, capacity, d_v, dtype=dtype, device=device)
        self.compute = compute or self.k.dtype  # the model's type: what the attention reads
        self.prefilling = True
        self.rows: torch.Tensor | None = None  # prefill: the slots (B,); step: arange(S_b)
        self.at: torch.Tensor | None = None  # step: where each row's new key and value go (``places``)
        self.view: tuple[int, int] = (0, 0)  # step: (S_b, C_b), the part the attention reads
        self.gathered = False  # step: the rows are chosen slots (``rows``), not [0, S_b)
        self.length = 0  # the attention's count of cached positions: a cross cache reads "filled" when > 0
        self.static = False

    def prefill(self, slot: torch.Tensor, start: int = 0) -> None:
        """Prefill the slots ``slot`` (B,) from column ``start`` on: columns [0, start) already hold a cached prefix
        (``prefix.py``), which the new tokens attend to; the model reads ``length`` as its positions' offset."""
        self.prefilling, self.rows, self.length = True, slot, start

    def step(self, rows: torch.Tensor, at: torch.Tensor | None, view: tuple[int, int], filled: bool,
             gathered: bool = False) -> None:
        """Step mode: the rows' new keys and values go to ``at`` (``places``; None for a cache only read, a
        cross-attention's); the attention reads ``view`` = (S_b, C_b) of rows [0, S_b), or of the slots ``rows``
        when ``gathered`` (a step retried one request at a time)."""
        self.prefilling, self.rows, self.at, self.view, self.length = False, rows, at, view, int(filled)
        self.gathered = gathered

    def places(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """Where the new tokens of rows (B,) at columns (B or 1, P) go in the buffer seen as a list of d-vectors:
        (B * H_kv * P,) indices, in the order of k.reshape(-1, d) for k (B, H_kv, P, d). A step's (one column a
        row: lengths[:, None]) depend on the heads and the capacity only, so layers of one shape share them."""
        heads, capacity = self.k.shape[1], self.k.shape[2]
        head = torch.arange(heads, device=rows.device)[None, :, None]  # (1, H_kv, 1)
        return ((rows[:, None, None] * heads + head) * capacity + columns[:, None, :]).reshape(-1)  # (B*H_kv*P,)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill: k, v (B, H_kv, P, d) into columns [start, start + P) of the B slots; returns them as they are,
        or after a cached prefix the slots' columns [0, start + P).
        Step: k, v (S_b, H_kv, 1, d) at each row's column; returns the rows' first C_b columns (S_b, H_kv, C_b, d).

        Both write whole d-vectors into the buffer seen as a list of them (S * H_kv * C, d): one ``index_copy_``
        of contiguous rows, cheaper on CPU than indexing (S, H_kv, C, d) on two dimensions."""
        if self.prefilling:  # columns [start, start + P) of each slot
            at = self.places(self.rows, torch.arange(self.length, self.length + k.shape[2], device=k.device)[None])
        else:
            at = self.at  # (S_b*H_kv,), made at ``step``
        self.k.view(-1, self.k.shape[3]).index_copy_(0, at, k.reshape(-1, k.shape[3]).to(self.k.dtype))
        self.v.view(-1, self.v.shape[3]).index_copy_(0, at, v.reshape(-1, v.shape[3]).to(self.v.dtype))
        if self.prefilling:
            if not self.length:  # as the cache holds them
                return self.read(k.to(self.k.dtype)), self.read(v.to(self.v.dtype))
            end = self.length + k.shape[2]  # the prefix's keys, then these: (B, H_kv, start + P, d)
            return self.read(self.k[:, :, :end].index_select(0, self.rows)), \
                self.read(self.v[:, :, :end].index_select(0, self.rows))
        return self.keys_values()

    def keys_values(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows, columns = self.view
        if self.gathered:
            k, v = self.k.index_select(0, self.rows)[:, :, :columns], self.v.index_select(0, self.rows)[:, :, :columns]
        else:
            k, v = self.k[:rows, :, :columns], self.v[:rows, :, :columns]
        return self.read(k), self.read(v)

    def read(self, t: torch.Tensor) -> torch.Tensor:
        """Cached keys or values in the model's type (exact: a half float is a float32), or as they are."""
        return t if t.dtype == self.compute else t.to(self.compute)

    def reorder(self, index: torch.Tensor) -> None:
        """Rows [0, len(index)) become rows ``index`` (beam search keeps and repeats hypotheses)."""
        n = len(index)
        self.k[:n] = self.k.index_select(0, index)
        self.v[:n] = self.v.index_select(0, index)


class SlotCaches:
    """One ``LayerCache`` of ``SlotKV`` per layer (a cross-attention one too for encoder-decoders), and the
    switches that put all of them in prefill or step mode."""

    def __init__(self, model: torch.nn.Module, slots: int, capacity: int, memory: int = 0,
                 dtype: torch.dtype | None = None) -> None:
        """``dtype``: the keys' and values' (default the model's float type; ``SlotKV`` rounds into another)."""
        weight = next(model.parameters())
        kv_dtype = dtype or weight.dtype
        layers = model.decoder_layers if hasattr(model, "decoder_layers") else model.layers
        shapes = {(layer.self_attn.n_kv_heads, layer.self_attn.d_qk, layer.self_attn.d_v) for layer in layers}
        self.buffer: torch.Tensor | None = None  # (L, 2, S, H_kv, C, d): every layer's self-attention keys, values
        if len(shapes) == 1 and (shape := shapes.pop())[1] == shape[2]:  # one tensor: one view serves all layers
            self.buffer = torch.zeros(len(layers), 2, slots, shape[0], capacity, shape[1], dtype=kv_dtype,
                                      device=weight.device)
        self.layers: list[LayerCache] = []
        for i, layer in enumerate(layers):
            sa, ca = layer.self_attn, layer.cross_attn
            self_kv = SlotKV(slots, sa.n_kv_heads, capacity, sa.d_qk, sa.d_v, kv_dtype, weight.device,
                             kv=self.buffer[i] if self.buffer is not None else None, compute=weight.dtype)
            cross = SlotKV(slots, ca.n_kv_heads, memory, ca.d_qk, ca.d_v, kv_dtype, weight.device,
                           compute=weight.dtype) if ca is not None else None
            self.layers.append(LayerCache(self_kv, cross))
        self.slots, self.capacity, self.memory = slots, capacity, memory

    def describe(self) -> str:
        """"; keys and values in float16" where the cache's type is not the model's (the log's runner line)."""
        kv = self.layers[0].self_attention
        return f"; keys and values in {str(kv.k.dtype).removeprefix('torch.')}" if kv.k.dtype != kv.compute else ""

    def all(self) -> list[SlotKV]:
        return [kv for layer in self.layers for kv in layer if kv is not None]

    def prefill(self, slot: torch.Tensor, start: int = 0) -> list[LayerCache]:
        for kv in self.all():
            kv.prefill(slot, start)
        return self.layers

    def step(self, lengths: torch.Tensor, capacity: int, memory: int,
             index: torch.Tensor | None = None) -> list[LayerCache]:
        """Step mode for rows [0, len(lengths)) (``index``: those slots instead) at columns ``lengths``, reading
        ``capacity`` columns (and ``memory`` source columns)."""
        n = len(lengths)
        rows = arange(n, lengths.device) if index is None else index
        places: dict[tuple[int, int], torch.Tensor] = {}  # (heads, capacity) -> indices: made once, not per layer
        for layer in self.layers:
            kv = layer.self_attention
            shape = (kv.k.shape[1], kv.k.shape[2])
            if shape not in places:
                places[shape] = kv.places(rows, lengths[:, None])
            kv.step(rows, places[shape], (n, capacity), filled=False, gathered=index is not None)
            if layer.cross_attention is not None:  # written at prefill: read only
                layer.cross_attention.step(rows, None, (n, memory), filled=True, gathered=index is not None)
        return self.layers

    def move(self, src: int, dst: int, columns: int, memory: int = 0) -> None:
        """Slot ``src``'s first ``columns`` keys and values (and ``memory`` cross-attention ones) into slot ``dst``
        (the engine's ``compact``); the columns beyond are never read unmasked, whatever they hold."""
        for layer in self.layers:
            for kv, n in ((layer.self_attention, columns), (layer.cross_attention, memory)):
                if kv is not None and n:
                    kv.k[dst, :, :n] = kv.k[src, :, :n]
                    kv.v[dst, :, :n] = kv.v[src, :, :n]

    def reorder(self, index: torch.Tensor) -> None:
        for kv in self.all():
            kv.reorder(index)

    def clear(self) -> None:
        """Every key and value back to 0, as new (after a warm-up wrote padding: unwritten columns hold 0)."""
        for kv in self.all():
            kv.k.zero_()
            kv.v.zero_()
