"""Every torch module against the NumPy reference in float64 (to 1e-10), and the properties of attention."""

import numpy as np
import pytest
import torch

from lmforge import reference as ref
from lmforge.nn import (
    FeedForward,
    MultiHeadAttention,
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerLayer,
    sinusoidal_table,
)

TOL = 1e-10


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def mha_weights(m: MultiHeadAttention):
    """(w_q, w_k, w_v, w_o, biases) of a torch MultiHeadAttention, in the reference's layout."""
    qk = m.n_heads * m.d_qk
    if m.cross:
        w_q, b_q = np_(m.q_proj.weight), np_(m.q_proj.bias)
        w_k, w_v = np.split(np_(m.kv_proj.weight), [qk])
        b_k, b_v = np.split(np_(m.kv_proj.bias), [qk])
    else:
        w_q, w_k, w_v = np.split(np_(m.in_proj.weight), [qk, 2 * qk])
        b_q, b_k, b_v = np.split(np_(m.in_proj.bias), [qk, 2 * qk])
    return w_q, w_k, w_v, np_(m.out_proj.weight), (b_q, b_k, b_v, np_(m.out_proj.bias))


def layer_params(layer: TransformerLayer) -> dict:
    w_q, w_k, w_v, w_o, (b_q, b_k, b_v, b_o) = mha_weights(layer.self_attn)
    return dict(w_q=w_q, w_k=w_k, w_v=w_v, w_o=w_o, b_q=b_q, b_k=b_k, b_v=b_v, b_o=b_o,
                ln1_g=np_(layer.norm1.weight), ln1_b=np_(layer.norm1.bias),
                ln2_g=np_(layer.norm2.weight), ln2_b=np_(layer.norm2.bias),
                w_1=np_(layer.ffn.fc1.weight), b_1=np_(layer.ffn.fc1.bias),
                w_2=np_(layer.ffn.fc2.weight), b_2=np_(layer.ffn.fc2.bias))


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights everywhere, layer-norm gains and biases included, so no term can hide."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5)
    return module


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- against the reference ------------------------------------------------------------------------------
@pytest.mark.parametrize("n_heads", [1, 3])
@pytest.mark.parametrize("need_weights", [True, False])
def test_self_attention_equals_reference(n_heads, need_weights):
    m = randomize(MultiHeadAttention(6, n_heads).double())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out, weights = m(x, need_weights=need_weights)
    w_q, w_k, w_v, w_o, biases = mha_weights(m)
    for b in range(2):
        r_out, r_w = ref.multi_head_attention(np_(x[b]), w_q, w_k, w_v, w_o, n_heads, biases=biases)
        np.testing.assert_allclose(np_(out[b]), r_out, atol=TOL)
        if need_weights:
            np.testing.assert_allclose(np_(weights[b]), r_w, atol=TOL)
    assert (weights is None) != need_weights


@pytest.mark.parametrize("need_weights", [True, False])
def test_masked_causal_and_cross_attention_equal_reference(need_weights):
    # causal self-attention with a padding mask
    m = randomize(MultiHeadAttention(6, 3, causal=True).double())
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    pad = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    out, _ = m(x, key_padding_mask=pad, need_weights=need_weights)
    w_q, w_k, w_v, w_o, biases = mha_weights(m)
    for b in range(2):
        mask = ref.causal_mask(5) & np_(pad[b])[None, :]
        r_out, _ = ref.multi_head_attention(np_(x[b]), w_q, w_k, w_v, w_o, 3, mask=mask, biases=biases)
        np.testing.assert_allclose(np_(out[b]), r_out, atol=TOL)
    # cross-attention over a memory of another length and width
    c = randomize(MultiHeadAttention(6, 3, cross=True, d_memory=4).double(), seed=1)
    memory = torch.randn(2, 7, 4, dtype=torch.float64)
    mem_pad = torch.ones(2, 7, dtype=torch.bool)
    mem_pad[1, 5:] = False
    out, weights = c(x, memory, key_padding_mask=mem_pad, need_weights=need_weights)
    w_q, w_k, w_v, w_o, biases = mha_weights(c)
    for b in range(2):
        r_out, r_w = ref.multi_head_attention(np_(x[b]), w_q, w_k, w_v, w_o, 3, mask=np_(mem_pad[b])[None, :],
                                              memory=np_(memory[b]), biases=biases)
        np.testing.assert_allclose(np_(out[b]), r_out, atol=TOL)
        if need_weights:
            np.testing.assert_allclose(np_(weights[b]), r_w, atol=TOL)


def test_separate_query_key_and_value_widths():
    """Seed 000 Q2: E=8, H=2, M_QK=3, M_V=5: W_q, W_k are (H*M_QK, E), W_v is (H*M_V, E), W_o is (E, H*M_V)."""
    m = randomize(MultiHeadAttention(8, 2, d_qk=3, d_v=5).double())
    assert m.in_proj.weight.shape == (2 * 3 + 2 * 3 + 2 * 5, 8)
    assert m.out_proj.weight.shape == (8, 10)
    x = torch.randn(1, 4, 8, dtype=torch.float64)
    out, weights = m(x, need_weights=True)
    w_q, w_k, w_v, w_o, biases = mha_weights(m)
    assert w_q.shape == (6, 8) and w_v.shape == (10, 8)
    r_out, r_w = ref.multi_head_attention(np_(x[0]), w_q, w_k, w_v, w_o, 2, biases=biases)
    np.testing.assert_allclose(np_(out[0]), r_out, atol=TOL)
    np.testing.assert_allclose(np_(weights[0]), r_w, atol=TOL)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_equals_reference(activation):
    f = randomize(FeedForward(6, 12, activation).double())
    x = torch.randn(3, 6, dtype=torch.float64)
    expected = ref.feed_forward(np_(x), np_(f.fc1.weight), np_(f.fc1.bias), np_(f.fc2.weight), np_(f.fc2.bias),
                                activation)
    np.testing.assert_allclose(np_(f(x)), expected, atol=TOL)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("n_heads", [1, 3])
def test_transformer_layer_equals_reference(norm_position, n_heads):
    layer = randomize(TransformerLayer(6, n_heads, 12, norm_position=norm_position, activation="gelu").double())
    layer.eval()
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    pad = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], dtype=torch.bool)
    out = layer(x, key_padding_mask=pad, need_weights=True)
    fast = layer(x, key_padding_mask=pad)
    np.testing.assert_allclose(np_(fast.hidden), np_(out.hidden), atol=TOL)
    for b in range(2):
        y, w = ref.encoder_layer(np_(x[b]), layer_params(layer), n_heads, norm_position,
                                 mask=np_(pad[b])[None, :], activation="gelu", eps=1e-5)
        np.testing.assert_allclose(np_(out.hidden[b]), y, atol=TOL)
        np.testing.assert_allclose(np_(out.self_attention[b]), w, atol=TOL)


def test_sinusoidal_module_equals_reference():
    np.testing.assert_allclose(np_(sinusoidal_table(50, 128)), ref.sinusoidal_positions(50, 128), atol=1e-12)
    pe = SinusoidalPositions(50, 16)
    np.testing.assert_allclose(np_(pe(torch.tensor([3, 7]))), ref.sinusoidal_positions(50, 16)[[3, 7]], atol=1e-6)


# -- properties of attention ------------------------------------------------------------------------------
def test_fast_path_equals_explicit_path_every_mask():
    m = randomize(MultiHeadAttention(8, 2, causal=True)).eval()
    x = torch.randn(3, 6, 8)
    pad = torch.ones(3, 6, dtype=torch.bool)
    pad[0, 4:] = False
    extra = torch.rand(1, 1, 6, 6) > 0.3
    extra[..., 0] = True
    for kwargs in ({}, {"key_padding_mask": pad}, {"attn_mask": extra}, {"key_padding_mask": pad, "attn_mask": extra}):
        fast = m(x, **kwargs).output
        explicit = m(x, need_weights=True, **kwargs).output
        torch.testing.assert_close(fast, explicit, atol=1e-5, rtol=1e-5)


def test_permutation_equivariance_without_positions():
    """Seed 002 (d): swapping the first two inputs swaps the first two output rows, nothing else."""
    m = randomize(MultiHeadAttention(6, 3).double())
    x = torch.randn(1, 5, 6, dtype=torch.float64)
    perm = torch.tensor([1, 0, 2, 3, 4])
    out = m(x).output
    out_swapped = m(x[:, perm]).output
    torch.testing.assert_close(out_swapped, out[:, perm], atol=1e-12, rtol=0)
    assert not torch.allclose(out_swapped, out)


@pytest.mark.parametrize("need_weights", [True, False])
def test_causal_masking_leaks_nothing(need_weights):
    layer = randomize(TransformerLayer(8, 2, 16, norm_position="pre", causal=True)).eval()
    x = torch.randn(1, 7, 8)
    base = layer(x, need_weights=need_weights).hidden
    for t in range(6):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(1, 6 - t, 8) * 10
        out = layer(changed, need_weights=need_weights).hidden
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])
    weights = layer(x, need_weights=True).self_attention
    assert torch.all(weights[0].triu(diagonal=1) == 0)


def test_padded_keys_get_zero_weight_and_change_nothing():
    m = randomize(MultiHeadAttention(8, 2)).eval()
    x = torch.randn(1, 4, 8)
    padded = torch.cat([x, torch.randn(1, 3, 8) * 100], dim=1)  # three padding positions with wild values
    pad = torch.tensor([[1, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    out, weights = m(padded, key_padding_mask=pad, need_weights=True)
    assert torch.all(weights[..., 4:] == 0)
    torch.testing.assert_close(out[:, :4], m(x).output, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m(padded, key_padding_mask=pad).output[:, :4], m(x).output, atol=1e-5, rtol=1e-5)


def test_rows_sum_to_one_and_huge_logits_do_not_overflow():
    m = MultiHeadAttention(8, 2)
    with torch.no_grad():
        m.in_proj.weight.mul_(1e4)  # scores of order 1e8..1e12
    x = torch.randn(2, 5, 8)
    out, weights = m(x, need_weights=True)
    assert torch.isfinite(weights).all() and torch.isfinite(out).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5))
    assert torch.isfinite(m(x).output).all()


def test_query_with_no_visible_key_gets_zero_on_both_paths():
    m = randomize(MultiHeadAttention(4, 1).double())
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    mask = torch.tensor([[False, False, False], [True, False, False], [True, True, True]])
    out, weights = m(x, attn_mask=mask, need_weights=True)
    assert torch.all(weights[0, 0, 0] == 0)
    torch.testing.assert_close(out, m(x, attn_mask=mask).output, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np_(out[0, 0]), np_(m.out_proj.bias))  # zero heads: only the output bias


# -- the KV cache and rotary positions ---------------------------------------------------------------------
@pytest.mark.parametrize("rotary", [False, True])
def test_kv_cache_step_by_step_equals_full_pass(rotary):
    rope = RotaryEmbedding(4, max_positions=32) if rotary else None
    layer = randomize(TransformerLayer(8, 2, 16, norm_position="pre", causal=True, cross_attention=True,
                                       rotary=rope)).eval()
    x, memory = torch.randn(2, 6, 8), torch.randn(2, 5, 8)
    full = layer(x, memory).hidden
    cache = layer.new_cache(2, max_len=6, memory_len=5, dtype=x.dtype, device=x.device)
    prefix = layer(x[:, :3], memory, cache=cache).hidden  # prompt of 3 at once
    steps = [layer(x[:, t: t + 1], memory, cache=cache).hidden for t in range(3, 6)]
    torch.testing.assert_close(torch.cat([prefix, *steps], dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.self_attention.length == 6 and cache.cross_attention.length == 5


def test_rotary_gives_relative_positions_and_keeps_norms():
    rope = RotaryEmbedding(8, max_positions=64).double()
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(m: int, n: int) -> float:
        return float((rope(q, torch.tensor([m])) * rope(k, torch.tensor([n]))).sum())

    assert score(5, 2) == pytest.approx(score(40, 37), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    torch.testing.assert_close(rope(q, torch.tensor([13])).norm(), q.norm())


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 3)
    with pytest.raises(ValueError, match="norm_position"):
        TransformerLayer(8, 2, 16, norm_position="sandwich")
    with pytest.raises(ValueError, match="memory"):
        MultiHeadAttention(8, 2, cross=True)(torch.randn(1, 2, 8))
