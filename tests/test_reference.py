"""The NumPy reference checked by hand-computed numbers and by independent implementations (torch)."""

import math

import numpy as np
import pytest
import torch

from lmforge import reference as ref


def test_softmax_is_stable_and_normalised():
    x = np.array([[1e4, 0.0, -1e4], [3.0, 3.0, 3.0]])
    s = ref.softmax(x)
    assert np.all(np.isfinite(s))
    np.testing.assert_allclose(s.sum(-1), 1.0)
    np.testing.assert_allclose(s[1], [1 / 3] * 3)
    np.testing.assert_allclose(ref.softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75])


def test_softmax_of_all_masked_row_is_zero_not_nan():
    s = ref.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    np.testing.assert_array_equal(s, [[0.0, 0.0], [1.0, 0.0]])


def test_sdpa_by_hand():
    # two keys at unit distance: scores q.k / sqrt(2)
    q = np.array([[1.0, 1.0]])
    k = np.array([[1.0, 1.0], [0.0, 0.0]])
    v = np.array([[10.0], [0.0]])
    out, w = ref.scaled_dot_product_attention(q, k, v)
    a = math.exp(2 / math.sqrt(2))
    np.testing.assert_allclose(w, [[a / (a + 1), 1 / (a + 1)]])
    np.testing.assert_allclose(out, [[10 * a / (a + 1)]])


def test_sdpa_mask_removes_keys():
    rng = np.random.default_rng(0)
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    mask = np.array([True, True, False, True, False])
    out, w = ref.scaled_dot_product_attention(q, k, v, mask[None, :])
    assert np.all(w[:, ~mask] == 0)
    out2, w2 = ref.scaled_dot_product_attention(q, k[mask], v[mask])
    np.testing.assert_allclose(out, out2, atol=1e-14)
    np.testing.assert_allclose(w[:, mask], w2, atol=1e-14)


def test_multi_head_with_one_head_is_plain_attention():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6))
    w_q, w_k, w_v = (rng.normal(size=(6, 6)) for _ in range(3))
    out, w = ref.multi_head_attention(x, w_q, w_k, w_v, np.eye(6), n_heads=1)
    out2, w2 = ref.scaled_dot_product_attention(x @ w_q.T, x @ w_k.T, x @ w_v.T)
    np.testing.assert_allclose(out, out2, atol=1e-13)
    np.testing.assert_allclose(w[0], w2, atol=1e-13)


def test_multi_head_uses_row_blocks_per_head():
    """Head h must use rows [h*d, (h+1)*d) of W_q, W_k, W_v (DESIGN.md / seed 002)."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 6))
    w_q, w_k, w_v = (rng.normal(size=(6, 6)) for _ in range(3))
    out, weights = ref.multi_head_attention(x, w_q, w_k, w_v, np.eye(6), n_heads=3)
    for h in range(3):
        rows = slice(2 * h, 2 * h + 2)
        o, w = ref.scaled_dot_product_attention(x @ w_q[rows].T, x @ w_k[rows].T, x @ w_v[rows].T)
        np.testing.assert_allclose(weights[h], w, atol=1e-13)
        np.testing.assert_allclose(out[:, rows], o, atol=1e-13)


def test_layer_norm_statistics():
    rng = np.random.default_rng(3)
    x = rng.normal(3.0, 5.0, size=(7, 16))
    y = ref.layer_norm(x, np.ones(16), np.zeros(16), eps=0.0)
    np.testing.assert_allclose(y.mean(-1), 0.0, atol=1e-12)
    np.testing.assert_allclose(y.var(-1), 1.0, atol=1e-12)
    g, b = rng.normal(size=16), rng.normal(size=16)
    np.testing.assert_allclose(ref.layer_norm(x, g, b, eps=0.0), y * g + b, atol=1e-12)


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh"])
def test_feed_forward_matches_torch(activation):
    rng = np.random.default_rng(4)
    x, w1, b1 = rng.normal(size=(3, 4)), rng.normal(size=(8, 4)), rng.normal(size=8)
    w2, b2 = rng.normal(size=(4, 8)), rng.normal(size=4)
    t = {k: torch.from_numpy(v) for k, v in dict(x=x, w1=w1, b1=b1, w2=w2, b2=b2).items()}
    acts = {"relu": torch.relu, "gelu": torch.nn.functional.gelu,
            "gelu_tanh": lambda h: torch.nn.functional.gelu(h, approximate="tanh")}
    expected = acts[activation](t["x"] @ t["w1"].T + t["b1"]) @ t["w2"].T + t["b2"]
    np.testing.assert_allclose(ref.feed_forward(x, w1, b1, w2, b2, activation), expected.numpy(), atol=1e-12)


def test_sinusoidal_positions_exact_formula():
    pe = ref.sinusoidal_positions(50, 128)
    assert pe.shape == (50, 128)
    for pos in (0, 1, 17, 49):
        for i in (0, 5, 63):
            angle = pos / 10000 ** (2 * i / 128)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-15)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-15)
    assert ref.sinusoidal_positions(3, 5).shape == (3, 5)  # odd width: last column is a sine


def test_sinusoidal_dot_products_depend_only_on_offset():
    pe = ref.sinusoidal_positions(64, 32)
    gram = pe @ pe.T
    np.testing.assert_allclose(gram[3, 10], gram[20, 27], atol=1e-10)
    np.testing.assert_allclose(np.diag(gram), 16.0)  # each (sin, cos) pair contributes 1


def test_one_hot_positions_orthogonal_only_up_to_d():
    p = ref.one_hot_positions(4, 6)
    np.testing.assert_array_equal(p @ p.T, np.eye(4))
    with pytest.raises(ValueError, match="need d >= 7"):
        ref.one_hot_positions(7, 6)


def test_lstm_cell_matches_torch_lstmcell():
    rng = np.random.default_rng(5)
    n_in, n_hid = 3, 4
    x, h, c = rng.normal(size=(2, n_in)), rng.normal(size=(2, n_hid)), rng.normal(size=(2, n_hid))
    cell = torch.nn.LSTMCell(n_in, n_hid).double()
    # torch keeps W_ih (4J, I) and W_hh (4J, J); the reference acts on [h; x] with one (4J, J + I) matrix.
    w = np.concatenate([cell.weight_hh.detach().numpy(), cell.weight_ih.detach().numpy()], axis=1)
    b = (cell.bias_ih + cell.bias_hh).detach().numpy()
    h_ref, c_ref, gates = ref.lstm_cell(x, h, c, w, b)
    h_t, c_t = cell(torch.from_numpy(x), (torch.from_numpy(h), torch.from_numpy(c)))
    np.testing.assert_allclose(h_ref, h_t.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(c_ref, c_t.detach().numpy(), atol=1e-12)
    assert set(gates) == {"i", "f", "g", "o"}


def test_lstm_state_update_by_hand():
    c = ref.lstm_state_update(np.array([2.0]), {"f": np.array([0.5]), "i": np.array([0.25]), "g": np.array([-0.4])})
    np.testing.assert_allclose(c, [0.9])


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_layer_residual_structure(norm_position):
    """With zero attention and FFN weights, a layer reduces to its norms (post) or to identity (pre)."""
    rng = np.random.default_rng(6)
    d = 4
    x = rng.normal(size=(3, d))
    zeros = {k: np.zeros((d, d)) for k in ("w_q", "w_k", "w_v", "w_o")}
    p = {**zeros, "b_q": np.zeros(d), "b_k": np.zeros(d), "b_v": np.zeros(d), "b_o": np.zeros(d),
         "w_1": np.zeros((8, d)), "b_1": np.zeros(8), "w_2": np.zeros((d, 8)), "b_2": np.zeros(d),
         "ln1_g": np.ones(d), "ln1_b": np.zeros(d), "ln2_g": np.ones(d), "ln2_b": np.zeros(d)}
    y, w = ref.encoder_layer(x, p, n_heads=2, norm_position=norm_position)
    expected = ref.layer_norm(ref.layer_norm(x, np.ones(d), np.zeros(d)), np.ones(d), np.zeros(d))
    np.testing.assert_allclose(y, expected if norm_position == "post" else x, atol=1e-12)
    np.testing.assert_allclose(w, 1 / 3)  # zero scores: uniform attention
    with pytest.raises(ValueError, match="norm_position"):
        ref.encoder_layer(x, p, n_heads=2, norm_position="middle")
