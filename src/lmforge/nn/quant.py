"""Weight-only quantized linear layers (CPU): int8 and int4 in groups of inputs.

    int8   W[n, k] ≈ s[n, j] q[n, k]                  j = k // group, q int8 in [-127, 127]; 1 byte a weight
                                                      (+ 2 bytes a group: GGUF's Q8_0 at group 32)
    int4   W[n, k] ≈ s[n, j] (q[n, k] - 8) + z[n, j]  j = k // group, q in [0, 15]; half a byte a weight
                                                      (+ 4 bytes a group: 1/8 of a byte a weight at group 32)

The group is 32 by default (64, 128, 256, or, for int8, the whole row: one scale a row, what torch's int8 kernel
reads and what directories saved before grouped int8 hold).

``QuantizedLinear`` computes y = x Ŵᵀ + b (Ŵ the dequantized weight, ``reference/quant.py``'s equations) with
lmforge's own kernels (nn/kernels.c, built on this machine at first use: 16 output rows a vector; int8 with
float32 activations, each weight dequantized once for four rows of x; int4 with the activations rounded to 8 bits
a block of 32, llama.cpp's scheme, and each block's sums in integer dot products) where they build, else with
torch's own CPU kernels,
``aten._weight_int8pack_mm`` and ``aten._weight_int4pack_mm_for_cpu`` (torchao's CPU layouts use the same two).
Those are vectorised for bfloat16 activations only (float32 ones take a scalar loop, 10-25x slower than a
float32 product): so with them x is rounded to bfloat16 on the way in and each output on the way out. Both
dequantize each weight in float32 (exact: a small integer times a bfloat16 scale, plus a zero) and accumulate
in float32 in a fixed order along k. Scales and zeros are bfloat16 (both read them so): ``quantize_int8`` /
``quantize_int4`` choose them so that every weight still lies within half a step of its dequantized value. A
row's output depends only on that row (the work is split by rows of Ŵ, never along k): the same bits alone or
in a batch, on 1 or 2 threads.

Against the float64 product of the same dequantized weight (tests/test_quant.py, ``product_bound``), an output
differs by at most (K + 2) 2^-24 sum_k |x_k Ŵ_nk| (float32 accumulation and dequantization), plus with torch's
kernels 2^-8 |y| (its bfloat16 rounding) + 2^-8 sum_k |x_k Ŵ_nk| (the inputs' rounding). kernels.c's int4
product is the float64 product of its 8-bit activations (``reference.quant.quantize_activations``) up to float32
rounding (``int4_bound``); those move x by at most half a step, d / 2, an input (SmolLM2's perplexity +0.16%
against float32 activations' -0.01%: docs/benchmarks.md; +0.34% with the int8 head's x rounded to 8 bits too,
``match_activations``).

``quantize(model, "int4")`` replaces a model's ``nn.Linear`` layers in place, the tied LM head included (its own
int8 copy, which the embedding's lookups then read: ``QuantizedEmbedding``). At batch 1 the 49152 x 576 head of
SmolLM2 took 7.2 ms in float32 (oneDNN packed), 1.6 ms in int8 and 0.9 ms in int4 with torch's kernels on this
2-core machine, and an int4 head costs 7.5% of perplexity where an int8 one costs ~0.2% (docs/models.md). A layer
the kernels cannot hold stays float and is named in what ``quantize`` returns: int4 needs out_features a
multiple of 16 and in_features a multiple of the group (32, 64, 128 or 256); int8 needs in_features a
multiple of 16 and of the group.

Saved, a layer's ``state_dict`` holds a form no CPU's packed layout shapes (``portable``: int4 two to a byte);
``from_portable`` repacks it, and ``layout(model)`` names the quantized layers for a directory's config.json.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import nn

from lmforge.nn import kernels

KINDS = ("int8", "int4")
GROUP = 32  # the default group: GGUF's block of 32 weights
GROUPS = (32, 64, 128, 256)  # what the int4 kernels accept (int8: these or a whole row)
ALIGN = 64  # bytes: the int8 kernel reads rows with aligned loads
ROWS_AT_ONCE = 1024  # rows quantized together: the float64 work of a 49152-row head stays ~5 MB a temporary, not 230


# -- choosing the integers ------------------------------------------------------------------------------------
def bf16_at_least(t: torch.Tensor) -> torch.Tensor:
    """The smallest bfloat16 values >= t (t >= 0, float64): scales that never shrink the range they must cover.

    >>> bf16_at_least(torch.tensor([1.0, 1.001], dtype=torch.float64)).tolist()
    [1.0, 1.0078125]
    """
    down = t.to(torch.bfloat16)
    up = (down.view(torch.int16) + 1).view(torch.bfloat16)  # the next bfloat16 above a positive one
    return torch.where(down.double() >= t, down, up)


def by_rows(quantizer: Callable) -> Callable:
    """``quantizer`` applied to blocks of ROWS_AT_ONCE rows (each row is independent), each block's results
    written into outputs made once: no list of parts to concatenate, so the blocks' float64 temporaries reuse
    the same memory (with parts kept and joined, the heap grew by ~300 MB quantizing SmolLM2's 49152-row head)."""
    @functools.wraps(quantizer)
    def apply(w: torch.Tensor, *args: int) -> tuple[torch.Tensor, ...]:
        outputs: tuple[torch.Tensor, ...] = ()
        for start, block in zip(range(0, w.shape[0], ROWS_AT_ONCE), w.detach().split(ROWS_AT_ONCE), strict=True):
            results = quantizer(block, *args)
            if not outputs:
                outputs = tuple(r.new_empty((w.shape[0], *r.shape[1:])) for r in results)
            for out, r in zip(outputs, results, strict=True):
                out[start:start + r.shape[0]] = r
        return outputs

    return apply


@by_rows
def quantize_int8(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """W (N, K) -> (q int8 (N, K), scales bfloat16 (N, K / group)) with |W - s q| <= s / 2: s >= max |W| / 127
    over each group (``group`` = K: one scale a row)."""
    n, k = w.shape
    g = w.double().reshape(n, k // group, group)  # (N, K/g, g)
    scales = bf16_at_least(g.abs().amax(dim=2) / 127)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # a group of zeros: any scale
    q = torch.round(g / scales.double()[..., None]).clamp(-127, 127)
    return q.reshape(n, k).to(torch.int8), scales


@by_rows
def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """W (N, K) -> (q (N, K) int32 in [0, 15], scales, zeros bfloat16 (N, K / group)), |W - Ŵ| <= s / 2.

    Per group of ``group`` weights, lo..hi must lie inside the grid z - 8 s .. z + 7 s. With s and z exact that
    is s = (hi - lo) / 15; both are rounded to bfloat16 here (relative error <= 2^-8), so s is widened by
    2 e / 15 with e = 2^-7 (max(|lo|, |hi|) + s0): the grid then has room 2 e to spare, more than twice the
    rounding of z (<= 2^-8 |z|), and z, rounded from the middle of the room, keeps lo..hi inside."""
    n, k = w.shape
    g = w.double().reshape(n, k // group, group)  # (N, K/g, g)
    lo, hi = g.amin(dim=2), g.amax(dim=2)  # (N, K/g)
    s0 = (hi - lo) / 15
    room = 2 ** -7 * (torch.maximum(lo.abs(), hi.abs()) + s0)
    scales = bf16_at_least((hi - lo + 2 * room) / 15)
    zero_group = scales == 0  # every weight 0: q = 8, z = 0
    scales = torch.where(zero_group, torch.ones_like(scales), scales)
    s = scales.double()
    zeros = torch.where(zero_group, 0.0, (hi - 7 * s + lo + 8 * s) / 2).to(torch.bfloat16)
    q = torch.round((g - zeros.double()[..., None]) / s[..., None] + 8).clamp(0, 15)
    return q.reshape(n, k).to(torch.int32), scales, zeros


def unsupported(out_features: int, in_features: int, kind: str, group: int = GROUP) -> str | None:
    """Why the kernels cannot hold a layer of this shape, or None."""
    if kind == "int8" and in_features % 16:
        return f"in_features {in_features} is not a multiple of 16"
    if kind == "int8":
        return None if in_features % group == 0 else f"in_features {in_features} is not a multiple of the group {group}"
    if out_features % 16:
        return f"out_features {out_features} is not a multiple of 16"
    if in_features % group:
        return f"in_features {in_features} is not a multiple of the group {group}"
    return None


def aligned(t: torch.Tensor) -> torch.Tensor:
    """t contiguous and starting at a multiple of ALIGN bytes (a view into a mapped file may not)."""
    t = t.contiguous()
    return t if t.data_ptr() % ALIGN == 0 else t.clone()


# -- the layer ------------------------------------------------------------------------------------------------
class QuantizedLinear(nn.Module):
    """y = x Ŵᵀ + b with Ŵ held as integers, b float32, in one of two layouts (``layout``):

        "lmforge"  kernels.c's (nn/kernels.py, built on this machine): outputs in tiles of 16 rows, activations
                   rounded a block of 32 (int8: to 16 bits; int4: to 8). int8: ``weight`` (N/16, K/2, 32) int8,
                   ``scales`` (N/16, K/32, 16) a block of 32; int4: ``weight`` (N/16, K/2, 16) uint8,
                   ``scales`` (N/16, K/32, 16, 2) scale-zero pairs
        "torch"    torch's kernels' (no C compiler, ``LMFORGE_KERNELS=torch``, or N not a multiple of 16):
                   int8: ``weight`` (N, K) and ``scales`` (N, 1), one a row: torch's int8 kernel reads no
                   other, so smaller groups are requantized to one scale a row (each weight moves by at most
                   half the row's step); int4: ``weight`` in the packed layout (N, K / 2) uint8 and ``scales``
                   (K / group, N, 2)

    Not an ``nn.Linear``: code that packs or casts every ``nn.Linear`` (the CPU runner's packed products,
    ``model.to(dtype)`` of its parameters) leaves it alone. ``forward(x, residual)`` adds a residual in the
    same call (the lean step's residual sums)."""

    def __init__(self, in_features: int, out_features: int, kind: str, weight: torch.Tensor,
                 scales: torch.Tensor, bias: torch.Tensor | None = None, group: int = GROUP,
                 layout: str = "torch") -> None:
        super().__init__()
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is not one of {KINDS}")
        self.in_features, self.out_features, self.kind, self.group = in_features, out_features, kind, group
        self.layout = layout
        self.activations = 8 if kind == "int4" else 16  # kernels.c's rounding of x: int8's may be 8 (match_activations)
        self.register_buffer("weight", aligned(weight))
        self.register_buffer("scales", scales.to(torch.bfloat16).contiguous())
        self.bias = nn.Parameter(bias.detach().float().clone(), requires_grad=False) if bias is not None else None

    @staticmethod
    def own_kernels(out_features: int, group: int = GROUP) -> bool:
        """Whether this layer takes kernels.c's layout: the library is built, the rows make whole tiles and the
        groups whole blocks of 32."""
        return out_features % 16 == 0 and group % kernels.BLOCK == 0 and kernels.library() is not None

    @classmethod
    def int8(cls, q: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> QuantizedLinear:
        """From q (N, K) int8 (or (N, K / 32, 32): ``kernels.pack_int8``) and scales (N, K / group), or (N,): one
        a row."""
        n, k = q.shape[0], q[0].numel()
        scales = scales.reshape(n, -1).to(torch.bfloat16)  # (N, K/g)
        group = k // scales.shape[1]
        if cls.own_kernels(n, group):  # a scale each block of 32
            blocks = scales.repeat_interleave(group // kernels.BLOCK, dim=1)
            w, tiles = kernels.pack_int8(q.to(torch.int8), blocks)
            return cls(k, n, "int8", w, tiles, bias, group, layout="lmforge")
        if group < k:  # torch's int8 kernel reads one scale a row: the groups requantized to one (within its step)
            w = (q.double().reshape(n, k // group, group) * scales.double()[..., None]).reshape(n, k)
            q, scales = quantize_int8(w, k)
        return cls(k, n, "int8", q.reshape(n, k).to(torch.int8), scales, bias, k)

    @classmethod
    def int4(cls, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group: int = GROUP,
             bias: torch.Tensor | None = None) -> QuantizedLinear:
        """From q (N, K) in [0, 15] and scales, zeros (N, K / group): packed once for the kernel here."""
        n, k = q.shape
        if group not in GROUPS:
            raise ValueError(f"group {group} is not one of {GROUPS} (the int4 kernel's)")
        if cls.own_kernels(n):  # a scale and a zero each block of 32
            per_block = group // kernels.BLOCK
            w, pairs = kernels.pack_int4(q, scales.repeat_interleave(per_block, dim=1),
                                         zeros.repeat_interleave(per_block, dim=1))
            return cls(k, n, "int4", w, pairs, bias, group, layout="lmforge")
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1)
        pairs = torch.stack([scales.to(torch.bfloat16), zeros.to(torch.bfloat16)], dim=-1)  # (N, K/g, 2)
        return cls(k, n, "int4", packed, pairs.transpose(0, 1), bias, group)  # scales: (K/g, N, 2)

    @classmethod
    def from_linear(cls, linear: nn.Linear, kind: str, group: int = GROUP) -> QuantizedLinear:
        """A float ``nn.Linear`` quantized (``quantize_int8`` / ``quantize_int4``)."""
        return cls.from_weight(linear.weight.detach(), kind, group, linear.bias)

    @classmethod
    def from_weight(cls, w: torch.Tensor, kind: str, group: int = GROUP,
                    bias: torch.Tensor | None = None) -> QuantizedLinear:
        """The layer of a float weight W (N, K) quantized (``quantize_int8`` / ``quantize_int4``)."""
        if kind == "int8":
            return cls.int8(*quantize_int8(w, group), bias=bias)
        return cls.int4(*quantize_int4(w, group), group=group, bias=bias)

    def _apply(self, fn: Callable, recurse: bool = True) -> QuantizedLinear:
        """Scales stay bfloat16 (the kernels read them so) whatever a ``model.float()`` or ``.double()`` casts."""
        super()._apply(fn, recurse)
        self.scales = self.scales.to(torch.bfloat16)
        return self

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x Ŵᵀ + b, or residual + (x Ŵᵀ + b) in the same call: x (..., K) -> (..., N)."""
        if self.layout == "lmforge":
            if x.dim() == 2 and x.dtype == torch.float32 and x.is_contiguous() and (residual is None or (
                    residual.dtype == torch.float32 and residual.is_contiguous())):  # a decoding step's case
                return kernels.product(self.kind, x, self.weight, self.scales, self.bias, residual, self.activations)
            rows = x.reshape(-1, self.in_features).to(torch.float32).contiguous()
            if residual is not None:
                residual = residual.reshape(-1, self.out_features).to(torch.float32).contiguous()
            y = kernels.product(self.kind, rows, self.weight, self.scales, self.bias, residual, self.activations)
            return y.to(x.dtype if x.is_floating_point() else torch.float32).reshape(*x.shape[:-1], -1)
        rows = x.reshape(-1, self.in_features)
        xb = rows.new_empty(rows.shape, dtype=torch.bfloat16).copy_(rows)  # (M, K): a fresh, aligned copy
        if self.kind == "int8":
            y = torch.ops.aten._weight_int8pack_mm(xb, self.weight, self.scales.reshape(-1))
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(xb, self.weight, self.group, self.scales)
        y = y.to(x.dtype if x.is_floating_point() else torch.float32)  # (M, N)
        if self.bias is not None:
            y = y + self.bias
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if residual is None else residual + y

    def integers(self) -> torch.Tensor:
        """q (N, K) as stored: int8 values, or int4 values in [0, 15]; torch's int4 layout is read back through
        its kernel itself (x = the identity, scale 1, zero 8: each output is one q exactly), so no private layout
        is assumed."""
        if self.layout == "lmforge":
            return kernels.unpack_int8(self.weight, self.scales)[0] if self.kind == "int8" else \
                kernels.unpack_int4(self.weight, self.scales)[0]
        if self.kind == "int8":
            return self.weight
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        ones = torch.tensor([1.0, 8.0], dtype=torch.bfloat16).expand(self.in_features // self.group,
                                                                     self.out_features, 2).contiguous()
        return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.weight, self.group, ones).T.to(torch.int32)

    def group_scales(self) -> torch.Tensor:
        """int8: the scales (N, K / group) bfloat16."""
        if self.layout == "lmforge":
            return kernels.unpack_int8(self.weight, self.scales)[1][:, :: self.group // kernels.BLOCK].contiguous()
        return self.scales.reshape(self.out_features, -1)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """int8: the dequantized rows Ŵ[ids] (..., K) float32, exact (a lookup: a tied head's rows are the token
        embeddings, ``QuantizedEmbedding``)."""
        if self.layout == "lmforge":  # weight (N/16, K/2, 32): row 16t + r's inputs 2j + e at [t, j, 2r + e]
            tile, lane = ids // 16, ids % 16
            q = self.weight.unflatten(-1, (16, 2))[tile, :, lane].flatten(-2)  # (..., K)
            s = self.scales[tile, :, lane]  # (..., K/32)
            return (q.float().unflatten(-1, (-1, kernels.BLOCK)) * s.float()[..., None]).flatten(-2)
        return self.weight[ids].float() * self.scales.reshape(self.out_features, -1)[ids].float()

    def scales_and_zeros(self) -> tuple[torch.Tensor, torch.Tensor]:
        """int4: scales and zeros (N, K / group) bfloat16."""
        if self.layout == "lmforge":
            _, s, z = kernels.unpack_int4(self.weight, self.scales.to(torch.bfloat16))  # (N, K/32) each
            step = self.group // kernels.BLOCK
            return s[:, ::step].contiguous(), z[:, ::step].contiguous()
        s, z = self.scales.to(torch.bfloat16).unbind(-1)  # (K/g, N) each
        return s.T.contiguous(), z.T.contiguous()

    def dequantized(self) -> torch.Tensor:
        """Ŵ (N, K) in float32 (exact: a small integer times a bfloat16 scale, plus a bfloat16 zero)."""
        q = self.integers().double()
        n, k = q.shape
        if self.kind == "int8":
            s = self.group_scales().double()  # (N, K/g)
            return (q.reshape(n, k // self.group, self.group) * s[..., None]).reshape(n, k).float()
        s, z = (t.double() for t in self.scales_and_zeros())  # (N, K/g) each
        w = (q.reshape(n, k // self.group, self.group) - 8) * s[..., None] + z[..., None]
        return w.reshape(n, k).float()

    def portable(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, scales) in the form a file keeps, whatever this machine's layout: int8 q (N, K) and
        scales (N, K / group); int4 q two a byte (N, K / 2) uint8, column 2i in the low nibble and 2i + 1 in the
        high, and (N, K / group, 2) scale-zero pairs. ``from_portable`` is the inverse (int8 scales (N,), one a
        row, as directories saved before grouped int8 hold them, read too)."""
        if self.kind == "int8":
            return self.integers(), self.group_scales()
        q = self.integers().to(torch.uint8)  # (N, K)
        return q[:, 0::2] | (q[:, 1::2] << 4), torch.stack(self.scales_and_zeros(), dim=-1)

    @classmethod
    def from_portable(cls, kind: str, weight: torch.Tensor, scales: torch.Tensor,
                      bias: torch.Tensor | None = None) -> QuantizedLinear:
        """The layer of what ``portable`` gave (repacked for this CPU's kernel; int4's group from the shapes)."""
        if kind == "int8":
            return cls.int8(weight, scales, bias)
        q = torch.stack([weight & 0x0F, weight >> 4], dim=-1).reshape(weight.shape[0], -1)  # (N, K)
        return cls.int4(q, scales[..., 0], scales[..., 1], q.shape[1] // scales.shape[1], bias)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        """``state_dict()`` holds the portable form (``portable``), so a saved model loads on any CPU."""
        destination[prefix + "weight"], destination[prefix + "scales"] = self.portable()
        if self.bias is not None:
            destination[prefix + "bias"] = self.bias if keep_vars else self.bias.detach()

    def extra_repr(self) -> str:
        group = f", group={self.group}"
        activations = ", 8-bit activations" if self.kind == "int8" and self.activations == 8 else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.kind}{group}, " \
               f"bias={self.bias is not None}, layout={self.layout}{activations}"


class QuantizedEmbedding(nn.Module):
    """Token embeddings looked up in a tied LM head's int8 rows, E[t] = Ŵ[t] (exact: q s): a quantized model then
    holds its vocabulary matrix once, in int8, instead of a float32 embedding beside the head's int8 copy. The
    head stays ``lm_head``'s own module (saved there); ``state_dict`` gives ``weight`` as the float32 rows, so a
    saved directory reads as it always did, and loading one ties the embedding again (``tie_embedding``)."""

    def __init__(self, head: QuantizedLinear) -> None:
        super().__init__()
        object.__setattr__(self, "head", head)  # not a submodule: its tensors are saved once, under lm_head
        self.num_embeddings, self.embedding_dim = head.out_features, head.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head.rows(ids)  # (..., D)

    def _save_to_state_dict(self, destination: dict, prefix: str, keep_vars: bool) -> None:
        destination[prefix + "weight"] = self.head.rows(torch.arange(self.num_embeddings))

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, the int8 rows of the tied head"


def tie_embedding(model: nn.Module) -> bool:
    """A decoder whose LM head is tied to its embedding and now an int8 ``QuantizedLinear``: the embedding looks
    its rows up in the head (``QuantizedEmbedding``) and its float32 matrix goes. Whether it was done."""
    head = getattr(getattr(model, "lm_head", None), "proj", None)
    config = getattr(model, "config", None)
    if not (isinstance(getattr(model, "tok_emb", None), nn.Embedding) and type(head) is QuantizedLinear
            and head.kind == "int8" and getattr(config, "tie_embeddings", False)
            and head.out_features == model.tok_emb.num_embeddings):
        return False
    model.tok_emb = QuantizedEmbedding(head)
    return True


def layout(model: nn.Module) -> dict[str, str]:
    """{layer name: "int8" | "int4"} of a model's quantized layers (what a saved directory's config.json keeps)."""
    return {name: m.kind for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}


def quantized_layer(w: torch.Tensor, kind: str, group: int = GROUP) -> QuantizedLinear | None:
    """The ``kind`` layer of a bias-free float weight W (N, K), or None where the kernels cannot hold its shape:
    what ``quantize`` makes of an ``nn.Linear`` with this weight (a loader quantizing layer by layer as it reads,
    ``interop.gguf.load_gguf``)."""
    with torch.no_grad():
        return None if unsupported(w.shape[0], w.shape[1], kind, group) else QuantizedLinear.from_weight(w, kind, group)


def match_activations(model: nn.Module) -> None:
    """A model with int4 layers has its int8 ones (the LM head) round their activations to 8 bits a block, as its
    int4 layers do and as llama.cpp multiplies a Q4 model's Q8_0 head: the byte products do twice the 16-bit ones'
    work an instruction (SmolLM2's 16-row head: 2.0 -> 1.1 ms), and int4's perplexity bound (3%) has the room
    (docs/models.md). Without int4 layers, int8 keeps 16 bits: 8 cost int8's perplexity 0.58%, past its 0.5%.
    Called wherever a quantized model is made: ``quantize``, a directory's load, ``load_gguf``."""
    layers = [m for m in model.modules() if type(m) is QuantizedLinear]
    bits = 8 if any(m.kind == "int4" for m in layers) else 16
    for m in layers:
        if m.kind == "int8":
            m.activations = bits


def quantize(model: nn.Module, kind: str, group: int = GROUP, head: str | None = "int8") -> list[str]:
    """Replace every float ``nn.Linear`` of ``model`` (a CPU model: the loader checks, ``interop.directories``)
    by a ``QuantizedLinear`` in place; the names of the layers left float (a shape the kernels cannot hold)
    with why. A tied LM head gets its own quantized copy of the embedding matrix, and, int8, becomes the
    embedding's too (``tie_embedding``: lookups of its rows; the float32 matrix goes).

    head: the format of the layers that score the vocabulary (out_features = the rows of the model's largest
    embedding: the LM head), None for float. int8 by default whatever ``kind``: on SmolLM2 an int4 head costs
    7.5% of perplexity, an int8 one ~0.2% (docs/models.md)."""
    if kind not in KINDS or head not in (*KINDS, None):
        raise ValueError(f"kind {kind!r} / head {head!r} is not one of {KINDS}")
    if group not in GROUPS:
        raise ValueError(f"group {group} is not one of {GROUPS}")
    vocab = max((m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)), default=None)
    kept = []
    targets = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        for name, linear in targets:
            this = head if linear.out_features == vocab else kind
            why = unsupported(linear.out_features, linear.in_features, this, group) if this else "the head"
            if why:
                kept.append(f"{name} ({why})")
                continue
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr,
                    QuantizedLinear.from_linear(linear, this, group))
    tie_embedding(model)
    match_activations(model)
    return kept
