"""Spatial self-attention (seed 001 problem 5): against the (x, y) loops of the NumPy reference, masks,
permutations and transposes, and the 2-D sinusoidal positions."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmforge.nn import MultiHeadAttention, SpatialSelfAttention, Transformer2D, Transformer2DLayer
from lmforge.nn.attention2d import sinusoidal_positions_2d
from lmforge.nn.positions import sinusoidal_table
from lmforge.reference import feed_forward, layer_norm
from lmforge.reference import sinusoidal_positions as sinusoidal_1d
from lmforge.reference.attention2d import sinusoidal_positions_2d as reference_positions_2d
from lmforge.reference.attention2d import spatial_self_attention

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(autouse=True)
def no_grad():
    """Only forward passes here."""
    with torch.no_grad():
        yield

X, Y, J, K, U, I_V = 3, 4, 8, 2, 3, 4  # grid, width, heads, query/key width, value width (K * I = J)


def seed_weights(attn: MultiHeadAttention) -> tuple[np.ndarray, ...]:
    """W^Q, W^K (K, U, J), W^V (K, I, J) and their biases (K, U), (K, U), (K, I) from the stacked in_proj."""
    w = attn.in_proj.weight.detach().numpy().copy()  # a copy: the tests edit the module afterwards
    b = attn.in_proj.bias.detach().numpy() if attn.in_proj.bias is not None else np.zeros(w.shape[0])
    qk = attn.n_heads * attn.d_qk
    cut = [(0, qk, attn.d_qk), (qk, 2 * qk, attn.d_qk), (2 * qk, w.shape[0], attn.d_v)]
    ws = [w[a:z].reshape(attn.n_heads, d, -1) for a, z, d in cut]  # head k: rows [k*d, (k+1)*d)
    bs = [b[a:z].reshape(attn.n_heads, d) for a, z, d in cut]
    return (*ws, *bs)


def grid(seed: int = 0, b: int = 1, n_x: int = X, n_y: int = Y, d: int = J) -> torch.Tensor:
    return torch.randn(b, n_x, n_y, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def attention(bias: bool = False, identity_out: bool = True) -> SpatialSelfAttention:
    torch.manual_seed(0)
    layer = SpatialSelfAttention(J, K, d_qk=U, d_v=I_V, bias=bias).double().eval()
    if identity_out:
        with torch.no_grad():
            layer.attn.out_proj.weight.copy_(torch.eye(J))
    return layer


def test_matches_the_seed_equations_with_the_vaswani_scale():
    layer = attention()
    h = grid()
    out, alpha = layer(h, need_weights=True)
    w_q, w_k, w_v, *_ = seed_weights(layer.attn)
    want_out, want_alpha = spatial_self_attention(h[0].numpy(), w_q, w_k, w_v, scale=1 / math.sqrt(U))
    np.testing.assert_allclose(alpha[0].detach().numpy(), want_alpha, rtol=0, atol=1e-10)
    np.testing.assert_allclose(out[0].detach().numpy(), want_out, rtol=0, atol=1e-10)
    fast, _ = layer(h)  # the fused path gives the same output
    np.testing.assert_allclose(fast[0].detach().numpy(), want_out, rtol=0, atol=1e-10)


def test_the_literal_seed_equation_has_no_scale():
    # Scaling W^Q by sqrt(U) cancels the module's 1/sqrt(U): the seed's softmax of raw Query·Key.
    layer = attention()
    w_q, w_k, w_v, *_ = seed_weights(layer.attn)
    with torch.no_grad():
        layer.attn.in_proj.weight[: K * U] *= math.sqrt(U)
    h = grid(1)
    out, alpha = layer(h, need_weights=True)
    want_out, want_alpha = spatial_self_attention(h[0].numpy(), w_q, w_k, w_v, scale=1.0)
    np.testing.assert_allclose(alpha[0].detach().numpy(), want_alpha, rtol=0, atol=1e-10)
    np.testing.assert_allclose(out[0].detach().numpy(), want_out, rtol=0, atol=1e-10)
    unscaled, _ = spatial_self_attention(h[0].numpy(), w_q, w_k, w_v, scale=1 / math.sqrt(U))
    assert np.abs(unscaled - want_out).max() > 1e-3  # the scale matters: the comparison can fail


def test_biases_output_projection_and_cell_mask_match_the_reference():
    layer = attention(bias=True, identity_out=False)
    h = grid(2, b=2)
    mask = torch.ones(2, X, Y, dtype=torch.bool)
    mask[0, 2, :] = False
    mask[1, 0, 1] = mask[1, 1, 3] = False
    out, alpha = layer(h, mask, need_weights=True)
    out, alpha = out.detach(), alpha.detach()
    w_q, w_k, w_v, b_q, b_k, b_v = seed_weights(layer.attn)
    w_o, b_o = layer.attn.out_proj.weight.detach().numpy(), layer.attn.out_proj.bias.detach().numpy()
    for b in range(2):
        heads, want_alpha = spatial_self_attention(h[b].numpy(), w_q, w_k, w_v, 1 / math.sqrt(U),
                                                   mask[b].numpy(), (b_q, b_k, b_v))
        np.testing.assert_allclose(alpha[b].detach().numpy(), want_alpha, rtol=0, atol=1e-10)
        np.testing.assert_allclose(out[b].detach().numpy(), heads @ w_o.T + b_o, rtol=0, atol=1e-10)
    assert float(alpha[0, :, :, :, 2, :].abs().max()) == 0.0  # nobody looks at a masked cell
    np.testing.assert_allclose(alpha.sum((-2, -1)).detach().numpy(), 1.0, atol=1e-12)


def test_masked_cells_leak_nothing_through_a_layer_stack():
    torch.manual_seed(0)
    model = Transformer2D(J, 2, 16, n_layers=2).double().eval()
    h = grid(3)
    mask = torch.ones(1, X, Y, dtype=torch.bool)
    mask[0, 1, 2] = mask[0, 0, 0] = False
    base, _ = model(h, mask)
    noisy = h.clone()
    noisy[~mask] = 100 * torch.randn(2, J, dtype=torch.float64)
    moved, _ = model(noisy, mask)
    torch.testing.assert_close(moved[mask], base[mask], rtol=0, atol=1e-12)
    unmasked, _ = model(noisy)
    assert (unmasked[mask] - base[mask]).abs().max() > 1e-3  # without the mask they would leak


def test_a_padded_grid_gives_the_unpadded_outputs():
    # A 3x4 image inside a 5x6 canvas: positions depend on (x, y) only, masked cells are invisible.
    torch.manual_seed(0)
    model = Transformer2D(J, 2, 16, n_layers=2).double().eval()
    h = grid(4)
    canvas = grid(5, n_x=5, n_y=6)
    canvas[:, :X, :Y] = h
    mask = torch.zeros(1, 5, 6, dtype=torch.bool)
    mask[:, :X, :Y] = True
    small, _ = model(h)
    big, _ = model(canvas, mask)
    torch.testing.assert_close(big[:, :X, :Y], small, rtol=0, atol=1e-12)


def test_without_positions_any_permutation_of_cells_permutes_the_outputs():
    torch.manual_seed(0)
    model = Transformer2D(J, 2, 16, n_layers=2, positions=False).double().eval()
    h = grid(6)
    perm = torch.randperm(X * Y, generator=torch.Generator().manual_seed(1))
    shuffled = h.reshape(1, X * Y, J)[:, perm].reshape(1, X, Y, J)
    out, _ = model(h)
    out_shuffled, _ = model(shuffled)
    torch.testing.assert_close(out_shuffled, out.reshape(1, X * Y, J)[:, perm].reshape(1, X, Y, J),
                               rtol=0, atol=1e-12)
    rolled, _ = model(torch.roll(h, shifts=(1, 2), dims=(1, 2)))  # a cyclic translation is a permutation too
    torch.testing.assert_close(rolled, torch.roll(out, shifts=(1, 2), dims=(1, 2)), rtol=0, atol=1e-12)


def test_2d_positions_tell_a_grid_from_its_transpose():
    torch.manual_seed(0)
    h = grid(7, n_x=4, n_y=4)
    transposed = h.transpose(1, 2)
    for positions in (False, True):
        model = Transformer2D(J, 2, 16, n_layers=1, positions=positions).double().eval()
        out, _ = model(h)
        out_t, _ = model(transposed)
        gap = float((out_t - out.transpose(1, 2)).abs().max())
        assert (gap > 1e-3) if positions else (gap < 1e-12)
    p = sinusoidal_positions_2d(4, 4, J)
    assert float((p - p.transpose(0, 1)).abs().max()) > 0.5 and torch.equal(p[2, 2], p.transpose(0, 1)[2, 2])


def test_2d_positions_equal_the_reference_and_split_channels_by_axis():
    p = sinusoidal_positions_2d(5, 7, 12)
    np.testing.assert_allclose(p.numpy(), reference_positions_2d(5, 7, 12), rtol=0, atol=1e-12)
    np.testing.assert_allclose(p[:, 3, :6].numpy(), sinusoidal_1d(5, 6), atol=1e-12)  # x half: 1-D in x
    np.testing.assert_allclose(p[2, :, 6:].numpy(), sinusoidal_1d(7, 6), atol=1e-12)  # y half: 1-D in y
    torch.testing.assert_close(p[4, :, :6], sinusoidal_table(5, 6)[4].expand(7, 6))  # constant along y
    with pytest.raises(ValueError, match="even"):
        sinusoidal_positions_2d(2, 2, 5)


def test_2d_position_similarity_depends_on_the_offset_in_both_axes():
    p = sinusoidal_positions_2d(8, 8, 16)
    gram = torch.einsum("abc,dec->abde", p, p)  # P(x1, y1) · P(x2, y2)
    for (x1, y1), (x2, y2), (a, b) in [((0, 0), (2, 3), (3, 1)), ((1, 5), (4, 2), (2, 2)), ((6, 1), (0, 0), (1, 4))]:
        assert float(gram[x1, y1, x2, y2]) == pytest.approx(float(gram[x1 + a, y1 + b, x2 + a, y2 + b]), abs=1e-12)
    # Unlike a 1-D encoding of the flattened index x*Y + y, the end of row 0 is not next to the start of row 1.
    assert float(gram[0, 7, 1, 0]) < float(gram[0, 0, 0, 1]) - 0.4  # 7.05 vs 7.54 (offset (1, -7) vs (0, 1))
    flat = torch.from_numpy(sinusoidal_1d(64, 16))
    assert float(flat[7] @ flat[8]) == pytest.approx(float(flat[0] @ flat[1]), abs=1e-12)


def test_transformer_2d_layer_is_the_post_ln_layer_over_cells():
    torch.manual_seed(0)
    layer = Transformer2DLayer(J, K, 16, norm_position="post").double().eval()
    h = grid(8)
    out, alpha = layer(h, need_weights=True)
    attn, ffn = layer.layer.self_attn, layer.layer.ffn
    w_q, w_k, w_v, b_q, b_k, b_v = seed_weights(attn)
    heads, want_alpha = spatial_self_attention(h[0].numpy(), w_q, w_k, w_v, 1 / math.sqrt(J // K), None,
                                               (b_q, b_k, b_v))

    def p(t):
        return t.detach().numpy()

    a = heads @ p(attn.out_proj.weight).T + p(attn.out_proj.bias)  # (X, Y, J)
    n1 = layer_norm(h[0].numpy() + a, p(layer.layer.norm1.weight), p(layer.layer.norm1.bias))
    f = feed_forward(n1, p(ffn.fc1.weight), p(ffn.fc1.bias), p(ffn.fc2.weight), p(ffn.fc2.bias), "relu")
    want = layer_norm(n1 + f, p(layer.layer.norm2.weight), p(layer.layer.norm2.bias))
    np.testing.assert_allclose(p(alpha[0]), want_alpha, rtol=0, atol=1e-10)
    np.testing.assert_allclose(p(out[0]), want, rtol=0, atol=1e-10)


def test_the_example_picture_numbers():
    # examples/attention_2d.py: with 2-D positions the four neighbours of the query weigh the same;
    # with the flattened index the cells above and below are Y positions away and weigh far less.
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "attention_2d.py"
    spec = importlib.util.spec_from_file_location("example_attention_2d", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    maps = example.attention_maps((3, 4))
    two_d, flat = maps["2-D sinusoids"], maps["1-D sinusoids of x·Y + y"]
    for alpha in maps.values():
        assert float(alpha.sum()) == pytest.approx(1.0, abs=1e-12)
    neighbours = torch.stack([two_d[2, 4], two_d[4, 4], two_d[3, 3], two_d[3, 5]])
    torch.testing.assert_close(neighbours, neighbours[:1].expand(4), rtol=0, atol=1e-12)
    assert float(flat[2, 4]) < 0.2 * float(flat[3, 3])
    assert float(maps["2-D sinusoids + content"][3, 3]) > 2 * float(two_d[3, 3])  # a shape cell next to the query


def test_docstring_examples():
    import doctest

    import lmforge.nn.attention2d
    import lmforge.reference.attention2d

    for module in (lmforge.nn.attention2d, lmforge.reference.attention2d):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__
