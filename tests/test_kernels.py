"""kernels.c (nn/kernels.py): built once per machine, torch's OpenMP threads, the portable path's bits equal the
AVX-512 path's, a machine without a compiler falls back to torch's kernels with one line; the step's norm and
attention against the NumPy references (the products: tests/test_quant.py)."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.nn import kernels
from lmforge.nn.quant import QuantizedLinear, quantize_int4, quantize_int8
from lmforge.reference import attention as reference_attention
from lmforge.reference import modern as reference_modern

needs_build = pytest.mark.skipif(kernels.compiler() is None, reason="no C compiler here: kernels.c cannot be built")


@pytest.fixture
def fresh_library(monkeypatch):
    """``kernels.library()`` decided again inside the test, and again after it (the rest of the suite's)."""
    kernels.library.cache_clear()
    yield
    kernels.library.cache_clear()


def test_without_a_compiler_the_layers_take_torchs_kernels_said_in_one_line(fresh_library, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "compiler", lambda: None)
    assert kernels.library() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["lmforge: quantized products use torch's kernels (kernels.c not built: no C compiler (cc) on "
                   "the PATH)"]
    q, s, z = quantize_int4(torch.randn(32, 64))
    assert QuantizedLinear.int4(q, s, z).layout == "torch"


def test_the_setting_chooses_torchs_kernels_silently(fresh_library, monkeypatch, capsys):
    monkeypatch.setenv(kernels.SETTING, "torch")
    assert kernels.library() is None and capsys.readouterr().err == ""


@needs_build
def test_a_build_is_cached_by_source_compiler_and_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path))
    cc = kernels.compiler()
    first = kernels.build(cc)
    assert first.exists() and kernels.build(cc) == first
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temporary file left
    monkeypatch.setattr(kernels, "cpu_flags", lambda: "flags : another machine")
    assert kernels.build(cc) != first


@needs_build
@pytest.mark.skipif(platform.system() != "Linux", reason="reads /proc/self/maps (Linux)")
def test_the_kernels_share_torchs_openmp_runtime():
    """One libgomp in the process: the build's OpenMP threads are torch's pool, not a second one."""
    assert kernels.library() is not None
    maps = Path("/proc/self/maps").read_text().splitlines()
    assert len({line.split()[-1] for line in maps if "libgomp" in line}) == 1


@needs_build
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build is x86-64's baseline")
@pytest.mark.parametrize("kind", ["int8", "int8-q8", "int4"])
def test_the_portable_build_gives_the_avx512_builds_bits(kind, monkeypatch):
    """kernels.c without AVX-512 (-march=x86-64: the plain C loops) computes every output in the same order as
    the vector code: the same bits, so a machine without AVX-512 decodes as this one does."""
    native = kernels.library()
    portable = kernels.load(kernels.build(kernels.compiler(), "x86-64"))
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 96, generator=g) * 0.1
    layer = QuantizedLinear.int8(*quantize_int8(w), bias=torch.randn(64, generator=g)) if kind != "int4" else \
        QuantizedLinear.int4(*quantize_int4(w), bias=torch.randn(64, generator=g))
    layer.activations = 8 if kind != "int8" else 16  # int8-q8: an int4 model's int8 head's (match_activations)
    x, residual = torch.randn(7, 96, generator=g), torch.randn(7, 64, generator=g)
    outputs = []
    for lib in (native, portable):
        monkeypatch.setattr(kernels, "library", lambda lib=lib: lib)
        outputs.append((layer(x), layer(x[:1]), layer(x, residual)))
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)



@needs_build
def test_the_float32_product_gives_a_row_the_same_bits_among_any_rows_and_on_the_portable_build(monkeypatch):
    """kernels.c's float32 product (the CPU runner's for float32 decoders): each output one sum over the inputs in
    order, so a row alone (one tile at a time), among 7 or 19 rows (pairs of tiles, 8 rows a pass) and on the plain C
    build has the same bits; against the float64 product to float32 rounding; bias and residual added after."""
    g = torch.Generator().manual_seed(5)
    w, bias = torch.randn(48, 200, generator=g), torch.randn(48, generator=g)  # 3 tiles: a pair and a lone one
    x, residual = torch.randn(19, 200, generator=g), torch.randn(19, 48, generator=g)
    packed = kernels.pack_float(w)
    assert packed.shape == (3, 200, 16) and torch.equal(packed[1, :, 5], w[21])
    runs = []
    for build in ("native", "x86-64") if platform.machine() in ("x86_64", "AMD64") else ("native",):
        if build != "native":
            portable = kernels.load(kernels.build(kernels.compiler(), build))
            monkeypatch.setattr(kernels, "library", lambda portable=portable: portable)
        whole = kernels.float_product(x, packed, bias, residual)
        alone = torch.cat([kernels.float_product(x[i:i + 1], packed, bias, residual[i:i + 1]) for i in range(19)])
        seven = kernels.float_product(x[:7], packed, None)
        assert torch.equal(whole, alone) and torch.equal(seven, kernels.float_product(x, packed, None)[:7])
        runs.append(whole)
    reference = (x.double() @ w.double().T + bias.double() + residual.double()).float()
    torch.testing.assert_close(runs[0], reference, rtol=0, atol=2e-4)
    assert all(torch.equal(run, runs[0]) for run in runs)

# -- a decoding step's other kernels, against the NumPy references --------------------------------------------------
def rotary_tables(positions: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (P, d) as the lean step lays them out: angle j and j + d/2 equal, sin's first half negated."""
    theta = torch.arange(positions, dtype=torch.float64)[:, None] * 10000.0 ** (-2.0 * torch.arange(d // 2) / d)
    cos, sin = torch.cat([theta.cos()] * 2, dim=-1), torch.cat([-theta.sin(), theta.sin()], dim=-1)
    return cos.float(), sin.float()


@needs_build
def test_the_kernels_exponential_is_within_2_ulp_and_the_portable_build_gives_its_bits(monkeypatch):
    """kernels.c's e^x (softmax's and SwiGLU's: glibc's expf is one value a call) against float64 on 10^6 points
    of [-87, 88], in ulps of the float32 result; NaN stays NaN, the ends saturate; the plain C build computes the
    same bits (the same fused multiply-adds in the same order)."""
    x = torch.cat([torch.linspace(-87, 88, 1_000_003), torch.tensor([0.0, -1e-30, 1e-30, float("nan"), -1e4, 1e4])])
    y = kernels.exp(x)
    ref = torch.exp(x[:-3].double())
    ulp = (torch.nextafter(ref.float(), torch.tensor(float("inf"))) - ref.float()).double()
    assert ((y[:-3].double() - ref).abs() / ulp).max() <= 2
    assert y[-3].isnan() and y[-2] < 1.2e-38 and y[-1] == torch.exp(torch.tensor(88.0))
    if platform.machine() in ("x86_64", "AMD64"):
        monkeypatch.setattr(kernels, "library", lambda: kernels.load(kernels.build(kernels.compiler(), "x86-64")))
        assert torch.equal(kernels.exp(x).view(torch.int32), y.view(torch.int32))  # NaN too


@needs_build
def test_rms_norm_equals_the_reference():
    x, w = torch.randn(3, 576, generator=torch.Generator().manual_seed(1)), torch.rand(576) + 0.5
    ref = reference_modern.rms_norm(x.double().numpy(), w.double().numpy(), 1e-5)
    assert np.abs(kernels.rms_norm(x, w, 1e-5).double().numpy() - ref).max() <= 2e-6 * np.abs(ref).max()


@needs_build
@pytest.mark.parametrize("rotary", [True, False])
def test_the_step_attention_writes_the_cache_and_attends_as_the_reference(rotary):
    """Rows at columns 0, 5 and 17 of slots 1..3 of a (2, S=4, H_kv=2, C=24, d=32) cache, 6 query heads: the new
    key (rotated) and value land at the row's column and nowhere else; each query head's output is the reference
    softmax attention of its rotated query over the row's columns 0..length of its key/value head."""
    g = torch.Generator().manual_seed(2)
    h, hkv, d, lengths = 6, 2, 32, torch.tensor([0, 5, 17])
    kv = torch.randn(2, 4, hkv, 24, d, generator=g)
    before = kv.clone()
    qkv = torch.randn(3, h + 2 * hkv, d, generator=g)
    raw = qkv.clone()
    cos, sin = rotary_tables(64, d) if rotary else (None, None)
    out = torch.empty(3, h * d)
    kernels.decode_attention(qkv, h, cos, sin, lengths, kv, 1, d ** -0.5, out)
    for b, at in enumerate(lengths.tolist()):
        x = raw[b].double().numpy()  # (h + 2 hkv, d)
        turned = reference_modern.rotate(x[: h + hkv, None], [at])[:, 0] if rotary else x[: h + hkv]
        new_k = turned[h:]
        assert np.allclose(kv[0, 1 + b, :, at].double().numpy(), new_k, atol=1e-5)
        assert torch.equal(kv[1, 1 + b, :, at], raw[b, h + hkv:])
        keys, values = kv[0, 1 + b, :, : at + 1].double().numpy(), kv[1, 1 + b, :, : at + 1].double().numpy()
        for j in range(h):
            expected, _ = reference_attention.scaled_dot_product_attention(turned[j][None], keys[j // 3],
                                                                          values[j // 3])
            assert np.allclose(out[b, j * d:(j + 1) * d].double().numpy(), expected[0], atol=1e-5)
    changed = (kv != before).any(dim=-1)  # (2, S, H_kv, C): only the rows' own columns
    assert changed.nonzero().tolist() == sorted([part, 1 + b, head, at] for part in range(2) for head in range(hkv)
                                                for b, at in enumerate(lengths.tolist()))


@needs_build
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build is x86-64's baseline")
@pytest.mark.parametrize("d", [48, 64])
def test_the_portable_builds_step_attention_and_norm_have_the_same_bits(monkeypatch, d):
    """Heads of 48 (the plain loops on both) and of 64 (the AVX-512 build's unrolled weighted values)."""
    native = kernels.library()
    portable = kernels.load(kernels.build(kernels.compiler(), "x86-64"))
    g = torch.Generator().manual_seed(4)
    kv, qkv = torch.randn(2, 2, 3, 40, d, generator=g), torch.randn(2, 15, d, generator=g)
    cos, sin = rotary_tables(64, d)
    x, w = torch.randn(2, 100, generator=g), torch.rand(100, generator=g)
    outputs = []
    for lib in (native, portable):
        monkeypatch.setattr(kernels, "library", lambda lib=lib: lib)
        cache, heads, out = kv.clone(), qkv.clone(), torch.empty(2, 9 * d)
        kernels.decode_attention(heads, 9, cos, sin, torch.tensor([39, 3]), cache, 0, 0.1, out)
        outputs.append((cache, heads, out, kernels.rms_norm(x, w, 1e-6)))
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


@needs_build
@pytest.mark.parametrize("d", [48, 64])
def test_a_half_cache_gives_the_bits_of_a_float32_cache_holding_its_values(d):
    """A float16 cache (``kv_cache="fp16"``): the new key (rotated) and value are written rounded to the nearest
    half, as torch's ``.to(float16)``, and nothing else changes; the attention reads the columns back exactly, so
    its outputs are bit for bit those of a float32 cache holding the same values (new ones that a half holds
    exactly, no rotation: the float32 cache then receives the same numbers), and close to the unrounded cache's."""
    g = torch.Generator().manual_seed(5)
    h, hkv, lengths = 6, 2, torch.tensor([0, 5, 17])
    exact = torch.randn(2, 4, hkv, 24, d, generator=g)
    qkv = torch.randn(3, h + 2 * hkv, d, generator=g)
    cos, sin = rotary_tables(64, d)
    half, heads = exact.half(), qkv.clone()
    kernels.decode_attention(heads, h, cos, sin, lengths, half, 1, d ** -0.5, torch.empty(3, h * d))
    written = exact.half()
    for b, at in enumerate(lengths.tolist()):  # heads[b, h:]: the rotated keys, then the values
        written[:, 1 + b, :, at] = heads[b, h:].reshape(2, hkv, d).half()
    assert torch.equal(half, written)
    qkv = qkv.half().float()  # values a half holds exactly
    out16, out32, unrounded = (torch.empty(3, h * d) for _ in range(3))
    kernels.decode_attention(qkv.clone(), h, None, None, lengths, exact.half(), 1, d ** -0.5, out16)
    kernels.decode_attention(qkv.clone(), h, None, None, lengths, exact.half().float(), 1, d ** -0.5, out32)
    kernels.decode_attention(qkv.clone(), h, None, None, lengths, exact.clone(), 1, d ** -0.5, unrounded)
    assert torch.equal(out16, out32)
    assert (out16 - unrounded).abs().max() < 5e-3 and not torch.equal(out16, unrounded)


@needs_build
@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build is x86-64's baseline")
def test_the_portable_builds_half_cache_has_the_same_bits(monkeypatch):
    """The half conversions (F16C's on the AVX-512 build, the baseline's in software) round and widen alike."""
    native = kernels.library()
    portable = kernels.load(kernels.build(kernels.compiler(), "x86-64"))
    g = torch.Generator().manual_seed(6)
    kv, qkv = torch.randn(2, 2, 3, 40, 64, generator=g).half(), torch.randn(2, 15, 64, generator=g) * 30
    cos, sin = rotary_tables(64, 64)
    outputs = []
    for lib in (native, portable):
        monkeypatch.setattr(kernels, "library", lambda lib=lib: lib)
        cache, heads, out = kv.clone(), qkv.clone(), torch.empty(2, 9 * 64)
        kernels.decode_attention(heads, 9, cos, sin, torch.tensor([39, 3]), cache, 0, 0.1, out)
        outputs.append((cache, heads, out))
    for a, b in zip(*outputs, strict=True):
        assert torch.equal(a, b)


@needs_build
def test_a_compiler_without_openmp_still_builds_the_kernels_single_threaded(fresh_library, monkeypatch, tmp_path,
                                                                             capsys):
    """Apple's clang refuses -fopenmp: the build is made again without it (its pragmas ignored) and said once;
    its products have the OpenMP build's bits."""
    real = kernels.compiler()
    fake = tmp_path / "cc"
    fake.write_text(f'#!/bin/sh\nfor a in "$@"; do [ "$a" = -fopenmp ] && {{ echo "error: unsupported option '
                    f"'-fopenmp'\" >&2; exit 1; }}; done\nexec {real} \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(kernels, "compiler", lambda: str(fake))
    single = kernels.library()
    assert single is not None
    assert "built without OpenMP" in capsys.readouterr().err
    q, s, z = quantize_int4(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)))
    x = torch.randn(3, 64)
    layer = QuantizedLinear.int4(q, s, z)
    ours = layer(x)
    kernels.library.cache_clear()
    monkeypatch.setattr(kernels, "compiler", lambda: real)
    assert torch.equal(layer(x), ours)
