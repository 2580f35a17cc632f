"""The CPU runner: the eager runner's calls made fast and batch-invariant on a CPU. Every CPU trick lives here.

1. Packed products. Inside the runner's calls, each float32 ``nn.Linear`` multiplies by a *packed* copy of its
   weight (``PackedProducts``): the weight reordered once into the tiles float_kernels.c's product reads
   (``kernels.pack_float``: 16 rows of W input by input, each output summed in order), or, in a compiled step or
   without a C compiler, the blocked layout oneDNN's kernels read (``torch.ops.mkldnn``), instead of BLAS
   repacking panels of W at every call. A row's output then has the same bits whatever the number of rows beside
   it and the thread count, which a plain product does not give (MKL picks other kernels and thread splits by row
   count): so a step computes exactly its active rows and a request gets the same logits alone or beside 15
   others. Packed products differ from ``F.linear`` by float rounding
   only; the packed copy is made at a layer's first call and again when its weight changed (the weight's memory
   twice over while served). The model's layers are plain ``nn.Linear``: the runner attaches the packed forward
   to each for the length of its call and takes it away after.
2. A thread policy. The fused attention of a prefill gives a row other bits in a batch of 16 than of 4 on two
   threads, so it runs on one (``one_thread`` inside ``CpuCall``). Steps whose bits do not depend on the thread
   count (packed products, quantized kernels) run at the count ``ThreadPolicy`` (runners/threads.py) measures
   faster: all the threads, or one when another process holds a core and a second thread would only wait for it.
   A model that does not pack (bfloat16 weights, unmerged LoRA) steps on one thread in multiples of ``MIN_ROWS``
   rows, where BLAS keeps a row's bits, and prefills one prompt at a time.
3. The lean step (generation/lean.py): a decoder's eager steps in about 18 torch calls a layer instead of the
   model's forward (62), the residual sums fused into the packed products (``packed_add``); its RMSNorm and
   attention by nn/step_kernels.c (``native``), and a quantized or float32 Llama-family model's whole layer stack
   in one call of it. A lone request steps beside a spare row (``rows_for``) where oneDNN computes a product, so
   that none computes a lone row.
4. One compiled step (``compile=True``, float32 decoders): the step compiled once for every row and column count
   (``dynamic=True``), the packed products kept whole in the graph as an operator (``lmforge::packed_linear``) and
   the many small operations between them fused. Prefills stay eager.

docs/benchmarks.md has the measurements behind each choice.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from lmforge.cores import fitting_threads, machine, one_thread
from lmforge.errors import LmforgeError
from lmforge.generation.lean import LeanStep, add_product, fits
from lmforge.generation.runners.eager import EagerRunner, decoder_step
from lmforge.generation.runners.threads import ThreadPolicy
from lmforge.generation.slots import MIN_ROWS, multiples
from lmforge.models.interfaces import is_encoder_decoder
from lmforge.nn import kernels

ROWS_HINT = 16  # the row count oneDNN's packed layout is chosen for (any count computes)
_PACKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # layer -> (weight key, weight ref, packed)


# -- packed products ------------------------------------------------------------------------------------------------
@functools.cache
def packing_available() -> bool:
    """Whether this torch build has oneDNN's packed linear (every x86-64 and Arm CPU wheel has)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packs(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and packing_available()


def packable(model: nn.Module) -> bool:
    """Whether every matrix product of a model can be packed: each module holding a matrix is a float32 CPU
    ``nn.Linear`` or an embedding (a lookup). Not so with unmerged LoRA, whose extra products are plain ones."""
    return all((isinstance(m, nn.Linear) and packs(m.weight)) or isinstance(m, nn.Embedding)
               for m in model.modules() if any(p.dim() == 2 for p in m.parameters(recurse=False)))


def tiled(layer: nn.Linear) -> bool:
    """Whether a layer's products run on float_kernels.c's product (built here, rows of W a multiple of 16)."""
    return kernels.library() is not None and layer.out_features % 16 == 0


def packed_weight(layer: nn.Linear, tiles: bool = False) -> torch.Tensor:
    """The layer's weight in float_kernels.c's layout (``tiles``: ``kernels.pack_float``, where ``tiled``) or
    oneDNN's, made again when the weight has changed since the last call (another tensor, other storage, or an
    in-place update)."""
    w = layer._parameters["weight"]
    key = (w.data_ptr(), -1 if w.is_inference() else w._version, tiles)
    held = _PACKS.get(layer)
    if held is None or held[0] != key or held[1]() is not w:
        packed = kernels.pack_float(w) if tiles else torch.ops.mkldnn._reorder_linear_weight(w.detach(), ROWS_HINT)
        held = key, weakref.ref(w), packed
        _PACKS[layer] = held
    return held[2]


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   residual: torch.Tensor | None = None) -> torch.Tensor:
    """The product of x (..., in) and a packed weight (plus ``residual`` (..., out), summed in the same call: the
    bits of the product and the sum made apart). float_kernels.c's layout (3 axes): its product, whose bits never
    depend on the row count. oneDNN's: a lone row is computed as two (the row twice): on AVX-512 machines oneDNN
    takes another kernel for one row of some widths, whose bits differ (the engine's steps compute at least two
    rows there: ``CpuRunner.rows_for``)."""
    if packed.dim() == 3:
        return kernels.float_product(x, packed, bias, residual)
    if x.numel() != x.shape[-1]:
        if residual is None:
            return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")
        return torch.ops.mkldnn._linear_pointwise.binary(x, residual, packed, bias, "add")
    pair = x.reshape(1, -1).expand(2, -1).contiguous()  # (2, in)
    if residual is None:
        out = torch.ops.mkldnn._linear_pointwise.default(pair, packed, bias, "none", [], "")
    else:
        out = torch.ops.mkldnn._linear_pointwise.binary(pair, residual.reshape(1, -1).expand(2, -1).contiguous(),
                                                        packed, bias, "add")
    return out[:1].reshape(*x.shape[:-1], packed.shape[0])


def packed_add(layer: nn.Module, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """residual + layer(x) in one oneDNN call while ``PackedProducts`` are attached (the lean step's residual
    sums, generation/lean.py); the plain two calls otherwise."""
    if torch.is_grad_enabled() or not hasattr(layer, "packed"):
        return add_product(layer, x, residual)
    return packed_product(x, layer.packed, layer.bias, residual)


@torch.library.custom_op("lmforge::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``packed_product`` as one operator, which ``torch.compile`` keeps whole (oneDNN's own op has no fake-tensor
    rule)."""
    return packed_product(x, packed, bias)


@packed_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(*x.shape[:-1], packed.shape[0])


class PackedProducts:
    """Attaches packed products to a model's ``nn.Linear`` layers for the length of a ``with`` block: each layer's
    ``forward`` becomes the packed one (``compiled``: through the operator a graph keeps), then its own again."""

    def __init__(self, model: nn.Module, compiled: bool = False) -> None:
        self.layers = [m for m in model.modules() if isinstance(m, nn.Linear)]  # found once
        # float_kernels.c's products where they fit, decided once; a graph keeps oneDNN's operator
        self.tiles = [not compiled and tiled(layer) for layer in self.layers]
        product = packed_linear if compiled else packed_product
        self.forwards = [self.forward_of(layer, product) for layer in self.layers]  # made once: a graph guards them

    @staticmethod
    def forward_of(layer: nn.Linear, product: Callable) -> Callable:
        def forward(x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():  # training the same model elsewhere: the plain product
                return F.linear(x, layer.weight, layer.bias)
            return product(x, layer.packed, layer.bias)

        return forward

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        # the instances' own dicts, not nn.Module's __setattr__ / __delattr__: a step attaches ~120 of them
        for layer, forward, tiles in zip(self.layers, self.forwards, self.tiles, strict=True):
            table = layer.__dict__
            table["packed"], table["forward"] = packed_weight(layer, tiles), forward
        try:
            yield
        finally:
            for layer in self.layers:
                table = layer.__dict__
                del table["packed"], table["forward"]


class CpuCall(TorchFunctionMode):
    """A prefill's fused attention (``F.scaled_dot_product_attention``) on one thread: on two, PyTorch's CPU kernel
    gives a row other bits in a batch of 16 than of 4. Steps' single queries take ``decode_attention``, whose bits
    depend neither on the batch nor on the threads, so steps need no mode (a mode sees every torch call)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            with one_thread():
                return func(*args, **kwargs)
        return func(*args, **kwargs)


def fits_one_graph(model: nn.Module) -> bool:
    """Whether the one dynamic step graph can run this model: a decoder whose every product packs (float32 CPU)."""
    return next(model.parameters()).device.type == "cpu" and not is_encoder_decoder(model) and packable(model)


class CpuRunner(EagerRunner):
    """The eager runner with packed products, the thread policy and (``compile=True``) one step graph."""

    name = "cpu"

    def __init__(self, model: nn.Module, slots: int, capacity: int, memory: int = 0, start_id: int | None = None,
                 prefix_blocks: int = 0, pad_id: int = 0, compile: bool = False,
                 kv_dtype: torch.dtype | None = None) -> None:
        threads = torch.get_num_threads()  # the policy's: torch's count, not the one the block below runs at
        with fitting_threads():  # its caches filled and its tables made on the cores that are free
            self.packed, self.dynamic = packable(model), compile
            # a spare row beside a lone one where oneDNN computes a product (a compiled step's, or a layer that
            # float_kernels.c does not hold: its bits, like the quantized kernels', never depend on the row count)
            self.spare_row = self.packed and any(type(m) is nn.Linear and (compile or not tiled(m))
                                                 for m in model.modules())
            if compile and not fits_one_graph(model):
                raise LmforgeError("compile: the CPU's one step graph is for float32 decoders (packed products); this "
                                   "model is not one (use compile=False, or the compiled runner: runner='compiled')")
            self.spare_columns = 32 if compile else 0  # keys read whole would be another (contiguous) view: a 2nd graph
            super().__init__(model, slots, capacity, memory, start_id, prefix_blocks if not compile else 0, pad_id,
                             kv_dtype)
            self.products = PackedProducts(model, compiled=compile) if self.packed else None
            self.lean = LeanStep(model, self.caches, packed_add if self.packed else add_product, native=True) \
                if not compile and fits(model, self.caches) else None
            self.name = "cpu, one compiled step" if compile else "cpu, lean step" if self.lean else "cpu"
            # the packed products' and quantized kernels' bits do not depend on the thread count: chosen by measurement
            measured = self.packed and self.lean is not None and threads > 1
            self.threads = ThreadPolicy(threads, start=1 if slots == 1 else None,
                                        load=machine()) if measured else None
            if compile:
                self.step_fn = self.one_graph()

    def rows_for(self, slots: int) -> list[int]:
        """Packed: the rows in use, at least 2 where oneDNN computes a product (a lone request's row and a spare
        one: oneDNN's products take another kernel for one row on some machines, and a size of 1 is always
        specialised by a compiler);
        otherwise multiples of MIN_ROWS, the slots rounded up (other counts change a row's bits on BLAS)."""
        if self.packed:
            least = 2 if self.spare_row else 1
            return list(range(least, max(slots, least) + 1))
        return multiples(MIN_ROWS, -(-max(slots, MIN_ROWS) // MIN_ROWS) * MIN_ROWS) if slots > 1 else [1]

    def slots_for(self, slots: int) -> int:
        """Packed: the slots asked for (a spare row is never held); otherwise every row a step computes."""
        return slots if self.packed else super().slots_for(slots)

    def step(self, tokens: list[int], lengths: list[int], sources: list[int],
             rows: list[int] | None = None) -> torch.Tensor:
        """The lean step (generation/lean.py) where the model fits it: rows [0, R_b), or one chosen slot (a step
        retried request by request); the eager runner's step otherwise."""
        if self.lean is None or (rows is not None and len(rows) > 1):
            return super().step(tokens, lengths, sources, rows)
        token_rows, lengths_t, columns = self.step_inputs(tokens, lengths, rows)
        first = rows[0] if rows else 0
        with self.calling(), self.threads.step() if self.threads else contextlib.nullcontext(), \
                self.adapters(slice(first, first + len(token_rows))):
            return self.lean(token_rows, lengths_t, columns, first)[: len(lengths)]

    def groups(self, arrivals):
        """Packed: prompts of a width bucket prefilled together; otherwise one by one (a row's bits would depend
        on the others in the BLAS products)."""
        if self.packed:
            return super().groups(arrivals)
        return [(group[0], [one]) for group in super().groups(arrivals) for one in group[1]]

    def choose(self, logits: torch.Tensor, slots: list[int]) -> list[int]:
        """The eager runner's choice at the count its step ran at: at two threads the (49,152-wide) argmax or
        draw woke the second thread every step, on a core another process holds (a token's choice does not
        depend on the thread count: tests/test_thread_policy.py)."""
        with self.threads.after() if self.threads else contextlib.nullcontext():
            return super().choose(logits, slots)

    def call_prefill(self, *args):
        with CpuCall(), self.products.attached() if self.products else contextlib.nullcontext(), \
                self.threads.follow() if self.threads else contextlib.nullcontext():
            return super().call_prefill(*args)

    def calling(self) -> contextlib.AbstractContextManager:
        """A step's products and thread policy: the packed products, or one thread."""
        return self.products.attached() if self.products else one_thread()

    def call_step(self, fn, *args):
        with self.calling():
            return super().call_step(fn, *args)

    def one_graph(self) -> Callable:
        """``decoder_step`` compiled once for every row and column count, the caches' sizes constants."""
        for kv in self.caches.all():
            torch._dynamo.mark_static(kv.k)
            torch._dynamo.mark_static(kv.v)
        graph = torch.compile(decoder_step, fullgraph=True, dynamic=True)

        def step(model: nn.Module, caches: list, tokens: torch.Tensor, lengths: torch.Tensor,
                 capacity: int) -> torch.Tensor:
            torch._dynamo.mark_dynamic(tokens, 0)
            torch._dynamo.mark_dynamic(lengths, 0)
            return graph(model, caches, tokens, lengths, capacity)

        return step

    def warmup(self) -> int:
        """Compile the one step graph (its first call), then check a second shape compiles nothing: 1 graph."""
        if not self.dynamic:
            return 0
        shapes = [(self.row_buckets[0], self.capacity_buckets[0]), (self.row_buckets[-1], self.capacity_buckets[-1])]
        with torch.inference_mode():
            for rows, columns in shapes:
                self.step([self.pad_id] * rows, [columns - 1] * rows, [1] * rows)
            self.caches.clear()  # as new: unwritten columns hold 0
        return 1
