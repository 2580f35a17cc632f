"""The lean decoding step (generation/lean.py): the torch calls a decoded token costs, counted, and its logits.

The count is of aten dispatches (``TorchDispatchMode`` sees every operator call that reaches the dispatcher from
Python: views, in-place writes and products alike) in one engine step that decodes one token, at batch 1, for a
decoder of SmolLM2-135M's layout (30 layers, 9 query and 3 key/value heads, RMSNorm, SwiGLU, rotary base 1e5,
tied embeddings) with small widths: the count depends on the structure, not the widths. Before the lean step the
CPU engine's step took 2,479 dispatches (the plain eager runner 1,874), about 62-80 a layer.
"""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lmforge.generation.engine import Engine, Request
from lmforge.generation.lean import LeanStep
from lmforge.models import Decoder, get_preset
from lmforge.nn import kernels

LIMIT = 600  # dispatches a decoded token may cost at 30 layers (issue 40 item 3: from ~1,870)


class Dispatches(TorchDispatchMode):
    """Counts every aten operator call inside the ``with`` block, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (the shared fixture in conftest.py)."""


def smollm2_shaped(**overrides) -> Decoder:
    """SmolLM2-135M's layout at small widths: 30 layers, 9 heads of 8, 3 key/value heads, SwiGLU, RMSNorm."""
    settings = dict(vocab_size=300, d_model=72, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=96, max_positions=256,
                    positions="rotary", norm="rmsnorm", activation="swiglu", bias=False, rope_base=1e5,
                    dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    return Decoder(get_preset("gpt-tiny", **{**settings, **overrides})).eval()


def decode_step_dispatches(model: Decoder, runner: str | None = None, rows: int = 1) -> Dispatches:
    """The dispatches of one engine step in which ``rows`` requests each decode one token (no admission)."""
    engine = Engine(model, slots=rows, runner=runner)
    for i in range(rows):
        engine.submit(Request([5, 6, 7, 8 + i], max_new_tokens=20, stop_ids=[]))
    engine.step()  # the prefills and a first decode
    engine.step()
    counted = Dispatches()
    with counted:
        engine.step()
    assert all(len(g.generation.tokens) == 4 for g in engine.scheduler.slots if g)  # 1 prefill + 3 steps
    return counted


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decoded_token_costs_at_most_600_dispatches_on_the_cpu_engine(dtype):
    """The CPU engine's default step at batch 1: <= 600 aten calls for 30 layers (2,479 before the lean step), with
    packed products (float32) and with plain ones (bfloat16: what a GPU would run)."""
    model = smollm2_shaped().to(dtype)
    counted = decode_step_dispatches(model)
    assert counted.total <= LIMIT, f"{counted.total} dispatches: {counted.ops.most_common(12)}"
    per_layer = (counted.total - decode_step_dispatches(smollm2_shaped(n_layers=2).to(dtype)).total) / 28
    assert per_layer <= 19, per_layer  # the layers' share: what grows with depth


def test_a_weights_transpose_follows_its_memory():
    """The plain residual product's Wᵀ is a view made once, and made again when the weight is other memory."""
    from lmforge.generation.lean import add_product, transposed

    layer = torch.nn.Linear(4, 3, bias=False)
    assert transposed(layer) is transposed(layer)
    x, residual = torch.randn(2, 4), torch.randn(2, 3)
    with torch.inference_mode():
        layer.weight.data = torch.randn(3, 4)  # a conversion or a load puts other memory in the same Parameter
        torch.testing.assert_close(add_product(layer, x, residual), residual + x @ layer.weight.T)
        layer.weight.data = layer.weight.data.double()
        torch.testing.assert_close(add_product(layer, x.double(), residual.double()),
                                   residual.double() + x.double() @ layer.weight.T)


def test_the_count_does_not_grow_with_the_rows():
    """16 rows decode in as many calls as one: nothing in the step loops over rows."""
    model = smollm2_shaped(n_layers=4)
    assert decode_step_dispatches(model, rows=16).total == decode_step_dispatches(model, rows=1).total


def test_the_plain_eager_runner_stays_the_reference():
    """runner="eager" still runs the model's own forward (the readable reference): many more calls."""
    assert decode_step_dispatches(smollm2_shaped(n_layers=4), runner="eager").total > \
        decode_step_dispatches(smollm2_shaped(n_layers=4)).total + 4 * 20


def gpt2_shaped() -> Decoder:
    """GPT-2's layout: learned positions, LayerNorm with biases, tanh-GELU, 4 heads (no grouping)."""
    torch.manual_seed(1)
    return Decoder(get_preset("gpt-tiny", vocab_size=300, n_layers=3, dropout=0.0, attention_dropout=0.0)).eval()


def decoded(model: Decoder, runner: str | None, work: list[list[int]], dtype=torch.float32) -> list[list[torch.Tensor]]:
    """The logits of every decoded token of each request, all decoded together in one engine of 8 slots."""
    engine = Engine(model.to(dtype), slots=8, runner=runner)
    handles = [engine.submit(Request(ids, max_new_tokens=6 + i, stop_ids=[], keep_logits=True))
               for i, ids in enumerate(work)]
    engine.run()
    return [g.logits for g in handles]


MIXED = [list(range(3, 3 + n)) for n in (1, 5, 9, 17, 33)]  # prompts of mixed lengths


def lean_logits(model: Decoder, **settings) -> tuple[list[torch.Tensor], LeanStep]:
    """The logits (6, V) of each of ``MIXED`` decoded together by the CPU engine, its lean step's attributes set
    first (``settings``: fused, native, native_layers); and that lean step."""
    engine = Engine(model, slots=8)
    lean = engine.runner.lean
    for name, value in settings.items():
        setattr(lean, name, value)
    handles = [engine.submit(Request(ids, max_new_tokens=6, stop_ids=[], keep_logits=True)) for ids in MIXED]
    engine.run()
    return [torch.stack(h.logits) for h in handles], lean


@pytest.mark.parametrize("shape", ["smollm2", "gpt2", "float64"])
def test_the_lean_step_gives_the_plain_steps_logits(shape):
    """Every logit of 5 requests of mixed lengths decoded together: the lean step (the CPU engine's) and the model's
    own forward (runner="eager") agree to float rounding (float64: to 1e-12, the same equations)."""
    model = gpt2_shaped() if shape == "gpt2" else smollm2_shaped(n_layers=4)
    dtype = torch.float64 if shape == "float64" else torch.float32
    engine = Engine(model.to(dtype), slots=8)
    assert engine.runner.lean is not None
    lean, plain = decoded(model, None, MIXED, dtype), decoded(model, "eager", MIXED, dtype)
    for a, b in zip(lean, plain, strict=True):
        torch.testing.assert_close(torch.stack(a), torch.stack(b), atol=1e-12 if shape == "float64" else 1e-5,
                                   rtol=0)


@pytest.mark.parametrize("kind", ["fp32", "int4"])
def test_a_row_stepped_alone_has_the_bits_it_has_in_the_batch(kind):
    """The engine's retry of a failed step, one request at a time (``rows=[i]``), gives each row the bits the
    batched step gave it, on 2 threads, and writes the same keys and values (int4: the layers in one kernels.c
    call, each row at its own slot)."""
    model = smollm2_shaped(n_layers=3, d_model=288, vocab_size=304) if kind == "int4" else smollm2_shaped(n_layers=3)
    if kind == "int4":
        from lmforge.nn.quant import quantize

        assert quantize(model, "int4") == []
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        engine = Engine(model, slots=8)
        for i in range(5):
            engine.submit(Request(list(range(3, 6 + 4 * i)), max_new_tokens=20, stop_ids=[]))
        engine.step()
        held = [engine.scheduler.slots[i] for i in range(5)]
        args = [s.token for s in held], [s.length for s in held], [s.source for s in held]
        runner = engine.runner
        if kind == "int4" and kernels.library() is not None:
            assert runner.lean.native_layers() is not None  # the one-call step
        with torch.inference_mode():
            together = runner.step(*args)  # (5, V)
            cache = runner.caches.buffer.clone()
            alone = torch.cat([runner.step([t], [n], [s], rows=[i])
                               for i, (t, n, s) in enumerate(zip(*args, strict=True))])
        assert torch.equal(together, alone) and torch.equal(cache, runner.caches.buffer)
    finally:
        torch.set_num_threads(before)


def test_the_fused_attention_gives_the_four_calls_logits():
    """The lean step's attention as one fused call (``fused``: scaled_dot_product_attention with the step's bias as
    its mask, what a GPU may prefer) against the four calls: every logit of mixed-length requests, to float
    rounding, and the fused step still counts far fewer calls than the model's forward."""
    model = smollm2_shaped(n_layers=4)
    fused, four = (lean_logits(model, fused=f, native=False)[0] for f in (True, False))
    for a, b in zip(fused, four, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.skipif(kernels.library() is None, reason="kernels.c could not be built here (no C compiler)")
def test_the_native_norm_and_attention_give_the_torch_calls_logits():
    """The CPU runner's lean step with kernels.c's RMSNorm and step attention (``native``, its default) against the
    same step in torch's calls: every logit of mixed-length requests, to float rounding."""
    model = smollm2_shaped(n_layers=4)
    (native, lean), (torch_calls, _) = lean_logits(model), lean_logits(model, native=False)
    assert lean.native  # the default
    for a, b in zip(native, torch_calls, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


@pytest.mark.skipif(kernels.library() is None, reason="kernels.c could not be built here (no C compiler)")
@pytest.mark.parametrize("kind", ["int8", "int4", "fp32"])
def test_a_quantized_models_layers_in_one_kernels_call_give_the_layer_by_layer_logits(kind):
    """Every product quantized in kernels.c's layout (or float32, with the CPU runner's kernels.c copy attached),
    RMSNorm, SwiGLU: the lean step runs all the layers in one step_kernels.c call (``native_layers``). Its logits
    against the same step layer by layer in Python (the C norm and attention, then torch's calls): to float
    rounding, which the quantized products' rounding of their activations (a block of 32 to 8 or 16 bits) can carry
    one step further; a replaced module turns the one call off."""
    from lmforge.nn.quant import quantize

    # heads of 32 and 304 tokens: every width a multiple of the int4 group, the head's rows of 16 (kernels.c's head)
    model = smollm2_shaped(n_layers=4, d_model=288, vocab_size=304)
    assert kind == "fp32" or quantize(model, kind) == []
    runs = {(native, stack): lean_logits(model, native=native, **({} if stack else {"native_layers": lambda: None}))
            for native, stack in ((True, True), (True, False), (False, False))}
    for (native, stack), (_, lean) in runs.items():
        assert (lean._stack is not None) == (native and stack)
    one_call = runs[True, True][0]
    for other in (runs[True, False][0], runs[False, False][0]):
        for a, b in zip(one_call, other, strict=True):
            torch.testing.assert_close(a, b, atol=2e-4, rtol=0)
    runner = Engine(model, slots=2).runner
    with runner.calling():  # a step's products (float32: their kernels.c copies attached)
        assert runner.lean.native_layers() is not None
    model.layers[1].ffn.fc2 = torch.nn.Linear(96, 288)  # float32 too: the runner found its layers once, not this one
    with runner.calling():
        assert runner.lean.native_layers() is None


@pytest.mark.skipif(kernels.library() is None, reason="kernels.c could not be built here (no C compiler)")
def test_the_one_call_follows_tensors_remade_under_it():
    """``model.float()`` re-makes every quantized product's bfloat16 scales (new tensors, the modules the same)
    between two requests of one engine: the one call's description is made again from them, never left pointing
    at the freed ones (whose memory the allocator hands out again); the logits stay those of before (the old
    code decoded garbage here)."""
    from lmforge.nn.quant import quantize

    model = smollm2_shaped(n_layers=4, d_model=288, vocab_size=304)
    quantize(model, "int4")
    engine = Engine(model, slots=2)

    def logits() -> torch.Tensor:
        handle = engine.submit(Request([5, 17, 3, 99], max_new_tokens=6, stop_ids=[], keep_logits=True))
        engine.run()
        return torch.stack(handle.logits)

    before, described = logits(), engine.runner.lean._stack[1]
    model.float()
    junk = [torch.full((1 << 16,), 1e30) for _ in range(64)]  # what would fill the freed scales
    assert torch.equal(logits(), before) and engine.runner.lean._stack[1] is not described
    del junk
