"""Weight-only quantized layers (nn/quant.py) against the float64 reference (reference/quant.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from lmforge import reference
from lmforge.generation.engine import Engine
from lmforge.models import Decoder, get_preset
from lmforge.nn import kernels
from lmforge.nn.quant import QuantizedEmbedding, QuantizedLinear, quantize, quantize_int4, quantize_int8
from lmforge.reference.quant import (
    dequantize_activations,
    dequantize_int4,
    dequantize_int8,
    quantize_activations,
    quantized_linear,
)
from test_engine import assert_batched_equals_alone


def weights(n: int, k: int, seed: int) -> torch.Tensor:
    """Gaussian weights with the awkward cases: a row of zeros, a constant group, a group far from 0, outliers."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * 0.05
    w[0] = 0.0
    w[1, :32] = 0.3
    w[2, 32:64] = 5.0 + w[2, 32:64] * 0.01
    w[3, 7] = 2.0
    return w


@pytest.fixture(params=["lmforge", "torch"])
def layout(request, monkeypatch) -> str:
    """Each test twice: layers in kernels.c's layout (built here), and in torch's (as without a compiler)."""
    if request.param == "lmforge" and kernels.library() is None:
        pytest.skip("kernels.c could not be built here (no C compiler): torch's layout only")
    if request.param == "torch":
        monkeypatch.setattr(kernels, "library", lambda: None)
    return request.param


def product_bound(x: np.ndarray, w: np.ndarray, y: np.ndarray, layout: str = "torch") -> np.ndarray:
    """|kernel - float64 product| per output: (K + 2) 2^-24 sum |x w| (float32 accumulation and dequantization),
    plus with torch's kernels 2^-8 |y| (bfloat16 output) + 2^-8 sum |x w| (bfloat16 inputs); see nn/quant.py."""
    mass = np.abs(x) @ np.abs(w).T
    accumulation = (x.shape[-1] + 2) * 2 ** -24 * mass
    return accumulation if layout == "lmforge" else accumulation + 2 ** -8 * (np.abs(y) + mass)


def int4_bound(x: np.ndarray, layer: QuantizedLinear) -> np.ndarray:
    """|kernels.c's int4 product - the float64 product of its 8-bit activations| per output: a block adds
    d s S + d m X (S = sum q xq, X = sum xq, m = z - 8 s) by two fused multiply-adds after two rounded products,
    so (2 K / 32 + 2) 2^-24 times the sum of those terms' sizes (not sum |x w|: a row of zeros, s (8 - 8) + 0,
    is 8 d s X - 8 d s X here, which rounds)."""
    xq, d = quantize_activations(x)  # (..., K), (..., K/32)
    q = layer.integers().double().numpy()  # (N, K)
    s, z = (t.double().numpy() for t in layer.scales_and_zeros())  # (N, K/32) each (group 32)
    n, k = q.shape
    sizes = np.abs(xq).reshape(*xq.shape[:-1], 1, k // 32, 32) * q.reshape(n, k // 32, 32)  # |xq| q
    terms = d[..., None, :] * (np.abs(s) * sizes.sum(-1) + np.abs(z - 8 * s) * np.abs(xq).reshape(
        *xq.shape[:-1], 1, k // 32, 32).sum(-1))  # (..., N, K/32)
    return (2 * k / 32 + 2) * 2 ** -24 * terms.sum(-1)


# -- the integers ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group", [32, 96])
def test_int8_weights_lie_within_half_a_step_of_their_dequantized_values(group):
    """Groups of 32 (the default), or one scale a row (group = K)."""
    w = weights(48, 96, 0)
    q, s = quantize_int8(w, group)
    assert q.dtype == torch.int8 and s.dtype == torch.bfloat16 and q.abs().max() <= 127 and s.shape == (48, 96 // group)
    err = np.abs(w.double().numpy() - dequantize_int8(q.numpy(), s.double().numpy()))
    assert (err <= np.repeat(s.double().numpy(), group, axis=1) / 2 * (1 + 1e-12)).all()
    assert err[0].max() == 0  # a row of zeros stays zeros


def test_int8_groups_follow_the_weights_better_than_one_scale_a_row():
    """A group far from the rest of its row (w[2, 32:64] ~ 5): its neighbours keep their own fine steps."""
    w = weights(48, 96, 0)
    error = {g: np.abs(w.double().numpy() - dequantize_int8(*(t.double().numpy() for t in quantize_int8(w, g))))
             for g in (32, 96)}
    assert error[32][2, :32].max() < error[96][2, :32].max() / 20


@pytest.mark.parametrize("group", [32, 64])
def test_int4_weights_lie_within_half_a_step_of_their_dequantized_values(group):
    """Scales and zeros are bfloat16, yet no weight falls outside its group's grid (no clamping error)."""
    w = weights(48, 128, 1)
    q, s, z = quantize_int4(w, group)
    assert q.min() >= 0 and q.max() <= 15 and s.dtype == z.dtype == torch.bfloat16
    s64 = s.double().numpy()
    err = np.abs(w.double().numpy() - dequantize_int4(q.numpy(), s64, z.double().numpy(), group))
    assert (err <= np.repeat(s64, group, axis=1) / 2 * (1 + 1e-12)).all()
    assert err[0].max() == 0


def test_rows_quantized_in_blocks_equal_rows_quantized_at_once(monkeypatch):
    import lmforge.nn.quant as quant

    w = weights(48, 64, 5)
    whole = quantize_int8(w), quantize_int4(w)
    monkeypatch.setattr(quant, "ROWS_AT_ONCE", 7)
    for a, b in zip(whole, (quantize_int8(w), quantize_int4(w)), strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("group", [32, 64])
def test_the_int4_kernels_layout_reads_back_the_same_integers_and_weights(layout, group):
    w = weights(32, 128, 2)
    q, s, z = quantize_int4(w, group)
    layer = QuantizedLinear.int4(q, s, z, group)
    assert layer.layout == layout and torch.equal(layer.integers(), q)
    assert all(torch.equal(a, b) for a, b in zip(layer.scales_and_zeros(), (s, z), strict=True))
    expected = dequantize_int4(q.numpy(), s.double().numpy(), z.double().numpy(), group)
    assert np.array_equal(layer.dequantized().double().numpy(), expected)


@pytest.mark.parametrize("group", [32, 96])
def test_the_int8_layout_reads_back_the_same_integers_and_weights(layout, group):
    """Either layout holds one scale a row as given; groups of 32 only kernels.c's (torch's kernel reads one scale
    a row: the groups are requantized, each weight within half a step of the row's scale)."""
    q, s = quantize_int8(weights(48, 96, 0), group)
    layer = QuantizedLinear.int8(q, s)
    exact = dequantize_int8(q.numpy(), s.double().numpy())
    if layout == "torch" and group == 32:
        row = layer.group_scales().double().numpy()
        assert layer.group == 96 and row.shape == (48, 1)
        assert (np.abs(layer.dequantized().double().numpy() - exact) <= row / 2 * (1 + 1e-12)).all()
        return
    assert layer.layout == layout and layer.group == group and torch.equal(layer.integers(), q)
    assert torch.equal(layer.group_scales(), s)
    assert np.array_equal(layer.dequantized().double().numpy(), exact)


def test_an_int8_layer_saved_with_one_scale_a_row_loads_as_it_was(layout):
    """Directories written before grouped int8 hold scales (N,): the layer reads them as one group a row."""
    q, s = quantize_int8(weights(48, 96, 0), 96)
    layer = QuantizedLinear.from_portable("int8", q, s.reshape(-1))
    assert layer.group == 96 and torch.equal(layer.dequantized(), QuantizedLinear.int8(q, s).dequantized())


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_layer_saved_in_one_layout_loads_in_the_other_with_the_same_weights(kind, monkeypatch):
    """The portable form is the layouts' meeting point: kernels.c's layer -> portable -> torch's layer, and back."""
    if kernels.library() is None:
        pytest.skip("kernels.c could not be built here (no C compiler)")
    linear = nn.Linear(128, 48)
    with torch.no_grad():
        linear.weight.copy_(weights(48, 128, 8))
    ours = QuantizedLinear.from_linear(linear, kind, 128 if kind == "int8" else 64)  # int8 in torch's: a row
    built = kernels.library
    monkeypatch.setattr(kernels, "library", lambda: None)
    theirs = QuantizedLinear.from_portable(kind, *ours.portable(), bias=ours.bias)
    monkeypatch.setattr(kernels, "library", built)
    again = QuantizedLinear.from_portable(kind, *theirs.portable(), bias=theirs.bias)
    assert (ours.layout, theirs.layout, again.layout) == ("lmforge", "torch", "lmforge")
    assert torch.equal(ours.dequantized(), theirs.dequantized())
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), again.state_dict().values(), strict=True))


# -- the product ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["int8", "int8-q8", "int4"])
@pytest.mark.parametrize("shape", [(32, 64), (96, 160), (64, 256)])
def test_the_kernels_product_equals_the_float64_reference_within_its_rounding(kind, shape, layout):
    """int8-q8: an int8 layer with 8-bit activations (an int4 model's head, ``match_activations``)."""
    n, k = shape
    linear = nn.Linear(k, n)
    with torch.no_grad():
        linear.weight.copy_(weights(n, k, 3))
    layer = QuantizedLinear.from_linear(linear, kind[:4])
    layer.activations = 8 if kind != "int8" else 16
    kind = kind[:4]
    assert layer.layout == layout
    x = torch.randn(2, 7, k, generator=torch.Generator().manual_seed(4))
    y = layer(x)
    assert y.shape == (2, 7, n) and y.dtype == torch.float32
    w = layer.dequantized().double().numpy()
    xs = x.double().numpy()
    if layout == "lmforge":  # kernels.c's products round the activations a block first: int4 to 8 bits, int8 16
        xs = dequantize_activations(*quantize_activations(x.numpy(), 127 if layer.activations == 8 else 32767))
    ref = quantized_linear(xs, w, linear.bias.detach().double().numpy())
    error = np.abs(y.double().numpy() - ref)
    int4_kernel = layout == "lmforge" and kind == "int4"
    bound = int4_bound(x.numpy(), layer) if int4_kernel else product_bound(xs, w, ref, layout)
    assert (error <= bound).all()
    assert error.max() > 0  # the bound is not idle: float32 (and bfloat16) rounding shows
    if layout == "lmforge" and kind == "int8":  # float32 arithmetic: far inside the bfloat16 part of torch's bound
        assert (error <= 2 ** -12 * product_bound(xs, w, ref)).all()


@pytest.mark.parametrize("shape", [(32, 64), (96, 160)])
def test_the_int4_kernels_8_bit_activations_move_a_product_by_at_most_half_a_step_an_input(shape):
    """kernels.c's int4 product (llama.cpp's scheme): x rounded to d xq per block of 32, |x - d xq| <= d / 2, so
    the product moves from the float32-activation one by at most sum_i d_b(i) / 2 |w_i|; in practice ~1/16 of the
    weights' own 4-bit rounding."""
    if kernels.library() is None:
        pytest.skip("kernels.c could not be built here (no C compiler): torch's int4 kernel rounds to bfloat16")
    n, k = shape
    layer = QuantizedLinear.from_linear(nn.Linear(k, n, bias=False), "int4")
    x = torch.randn(9, k, generator=torch.Generator().manual_seed(5))
    xq, d = quantize_activations(x.numpy())
    assert np.abs(xq).max() == 127 and (np.abs(x.double().numpy() - dequantize_activations(xq, d))
                                          <= np.repeat(d, 32, axis=-1) / 2 * (1 + 1e-6)).all()
    w = layer.dequantized().double().numpy()
    exact = quantized_linear(x.double().numpy(), w)
    bound = (np.repeat(d, 32, axis=-1).astype(np.float64) / 2) @ np.abs(w).T
    moved = np.abs(layer(x).double().numpy() - exact)
    assert (moved <= bound + int4_bound(x.numpy(), layer)).all() and moved.max() > 0


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_residual_added_in_the_product_equals_the_sum_after_it(kind, layout):
    layer = QuantizedLinear.from_linear(nn.Linear(64, 48), kind)
    g = torch.Generator().manual_seed(9)
    x, residual = torch.randn(5, 64, generator=g), torch.randn(5, 48, generator=g)
    assert torch.equal(layer(x, residual), residual + layer(x))


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_output_does_not_depend_on_the_other_rows_or_the_threads(kind, threads, layout):
    """Every row count 1..40 gives each row the bits it gets alone (the engine's rule), on 1 and 2 threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        layer = QuantizedLinear.from_linear(nn.Linear(256, 192), kind)
        x = torch.randn(40, 256, generator=torch.Generator().manual_seed(5))
        alone = torch.cat([layer(x[i:i + 1]) for i in range(40)])
        for m in range(1, 41):
            assert torch.equal(layer(x[:m]), alone[:m]), m
    finally:
        torch.set_num_threads(before)


# -- a model ---------------------------------------------------------------------------------------------------
def llama() -> Decoder:
    config = get_preset("gpt-tiny", vocab_size=300, dropout=0.0, attention_dropout=0.0, positions="rotary",
                        norm="rmsnorm", activation="swiglu", bias=False, n_kv_heads=2, max_positions=128)
    torch.manual_seed(0)
    return Decoder(config).eval()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_quantize_replaces_every_linear_and_makes_the_head_int8(kind, layout):
    """Every linear layer quantized; the head (300 rows: the vocabulary) int8 whatever the kind (with int4, its
    activations rounded to 8 bits, as the int4 layers round theirs: ``match_activations``), quantized from
    the tied embedding, whose lookups then read the head's rows (its float32 matrix gone): each within a step of
    the float row; ``state_dict`` still gives the embedding as float32 rows."""
    model = llama()
    embedding = model.tok_emb.weight.detach().clone()
    assert quantize(model, kind) == []
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    assert len(layers) == 9 and not any(isinstance(m, nn.Linear | nn.Embedding) for m in model.modules())
    head = layers["lm_head.proj"]
    assert head.kind == "int8" and layers["layers.0.ffn.fc1"].kind == kind
    assert head.activations == (8 if kind == "int4" else 16)  # an int4 model's head rounds x as its layers do
    assert isinstance(model.tok_emb, QuantizedEmbedding) and not list(model.tok_emb.parameters())
    ids = torch.tensor([[0, 5, 299], [7, 7, 1]])
    assert torch.equal(model.tok_emb(ids), head.dequantized()[ids])
    step = np.repeat(head.group_scales().double().numpy(), head.group, axis=1)  # (V, D)
    # within a step (half of it; plus half a group's, itself smaller, where torch's layout merged the groups)
    assert (np.abs(head.dequantized().double().numpy() - embedding.double().numpy()) <= step * (1 + 1e-12)).all()
    assert torch.equal(model.state_dict()["tok_emb.weight"], head.dequantized())


def test_an_untied_or_float_head_leaves_the_embedding_float():
    untied = get_preset("gpt-tiny", vocab_size=304, dropout=0.0, attention_dropout=0.0, tie_embeddings=False)
    for model, head in ((Decoder(untied).eval(), "int8"), (llama(), None)):
        quantize(model, "int4", head=head)
        assert isinstance(model.tok_emb, nn.Embedding)


def test_quantize_names_the_layers_it_leaves_float():
    model = llama()
    assert quantize(model, "int4", head="int4") == ["lm_head.proj (out_features 300 is not a multiple of 16)"]
    assert quantize(llama(), "int4", head=None) == ["lm_head.proj (the head)"]
    assert isinstance(model.lm_head.proj, nn.Linear)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_quantized_models_logits_follow_the_float_ones(kind):
    """A random 2-layer model: the logits move by a fraction of their spread (a bound, not bits)."""
    ref = llama()
    model = llama()
    quantize(model, kind)
    ids = torch.randint(3, 300, (2, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        a, b = ref(ids).logits, model(ids).logits
    assert (a - b).abs().max() < {"int8": 0.05, "int4": 0.4}[kind] * a.std()


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_cpu_engine_leaves_quantized_layers_alone_and_a_request_gets_what_it_gets_alone(kind, layout):
    """Two threads: the CPU runner packs the float layers that remain (none here) and steps exactly the rows in
    use, a lone request's one row alone (no oneDNN product needs a spare); a request beside 3 others gets the
    logits it gets alone, bit for bit."""
    model = llama()
    quantize(model, kind)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        g = torch.Generator().manual_seed(7)
        work = [torch.randint(3, 300, (int(n),), generator=g).tolist() for n in torch.randint(2, 30, (4,), generator=g)]
        engine = Engine(model, slots=4)
        assert engine.runner.packed and engine.runner.products.layers == []
        assert engine.runner.rows_for(4) == [1, 2, 3, 4]
        assert_batched_equals_alone(engine, model, work, 6, slots=4)
    finally:
        torch.set_num_threads(before)


def test_the_reference_is_the_plain_product():
    x, w = np.ones((1, 4)), np.arange(8.0).reshape(2, 4)
    assert quantized_linear(x, w, np.array([1.0, 0.0])).tolist() == [[7.0, 22.0]]
    assert reference.quant.dequantize_int8(np.array([[2, -1]]), np.array([0.5])).tolist() == [[1.0, -0.5]]
