"""Grouped-query attention (docs/models.md): the NumPy reference by hand, the torch attention and the whole
Decoder against it in float64 (1e-10), the cache holding only the key/value heads, and MHA as the case H_kv = H."""

import numpy as np
import pytest
import torch

from lmforge import reference as ref
from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.models import Decoder, DecoderConfig, load_pretrained, save_pretrained
from lmforge.nn import MultiHeadAttention, RotaryEmbedding, TransformerLayer
from lmforge.reference import modern as mref
from lmforge.reference.gqa import group_of, grouped_heads
from lmforge.train.optim import hidden_matrices
from test_modern import decoder_params, tiny
from test_nn import randomize

TOL = 1e-10
LLAMA = dict(norm="rmsnorm", positions="rotary", activation="swiglu", bias=False, tie_embeddings=False,
             rope_base=100000.0, eps=1e-5)


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def gqa_params(m: MultiHeadAttention) -> dict:
    """w_q (H d, D), w_k, w_v (H_kv d, D), w_o and the biases, cut out of the fused in_proj."""
    cuts = np.cumsum(m.widths())[:2]
    p = dict(zip(("w_q", "w_k", "w_v"), np.split(np_(m.in_proj.weight), cuts), strict=True))
    p["w_o"] = np_(m.out_proj.weight)
    if m.in_proj.bias is not None:
        p.update(zip(("b_q", "b_k", "b_v"), np.split(np_(m.in_proj.bias), cuts), strict=True))
        p["b_o"] = np_(m.out_proj.bias)
    if m.q_norm is not None:
        p.update(g_q=np_(m.q_norm.weight), g_k=np_(m.k_norm.weight))
    return p


def gqa_decoder_params(model: Decoder) -> dict:
    p = decoder_params(model)  # test_modern's, then each layer's attention cut for H_kv heads
    for layer, mine in zip(p["layers"], model.layers, strict=True):
        layer.update(gqa_params(mine.self_attn))
    return p


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- the reference by hand ------------------------------------------------------------------------------------
def test_reference_groups_and_mha_with_repeated_key_value_rows():
    """GQA == MHA whose W_k, W_v repeat each key/value head's rows for the H / H_kv query heads of its group."""
    assert [group_of(h, 8, 2) for h in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [group_of(h, 4, 4) for h in range(4)] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="divisible"):
        group_of(0, 6, 4)
    rng = np.random.default_rng(0)
    d, n_heads, n_kv = 3, 6, 2
    x = rng.normal(size=(5, 12))
    w_q, w_o = rng.normal(size=(n_heads * d, 12)), rng.normal(size=(12, n_heads * d))
    w_k, w_v = rng.normal(size=(n_kv * d, 12)), rng.normal(size=(n_kv * d, 12))
    biases = tuple(rng.normal(size=n) for n in (n_heads * d, n_kv * d, n_kv * d, 12))
    mask = ref.causal_mask(5)
    out, weights = ref.grouped_query_attention(x, w_q, w_k, w_v, w_o, n_heads, n_kv, mask, biases)

    def repeat(w: np.ndarray) -> np.ndarray:  # (H_kv d, ...) -> (H d, ...): block g copied H / H_kv times
        return np.concatenate([w[g * d:(g + 1) * d] for h in range(n_heads) for g in [h // (n_heads // n_kv)]])

    mha_biases = (biases[0], repeat(biases[1]), repeat(biases[2]), biases[3])
    out_mha, weights_mha = ref.multi_head_attention(x, w_q, repeat(w_k), repeat(w_v), w_o, n_heads, mask,
                                                    biases=mha_biases)
    np.testing.assert_allclose(out, out_mha, atol=1e-12)
    np.testing.assert_allclose(weights, weights_mha, atol=1e-12)
    assert not np.allclose(weights[0], weights[1])  # same keys, different queries: different rows
    # H_kv = H is multi-head attention exactly
    w_k6, w_v6 = rng.normal(size=(n_heads * d, 12)), rng.normal(size=(n_heads * d, 12))
    np.testing.assert_allclose(ref.grouped_query_attention(x, w_q, w_k6, w_v6, w_o, n_heads, n_heads)[0],
                               ref.multi_head_attention(x, w_q, w_k6, w_v6, w_o, n_heads)[0], atol=1e-12)


def test_reference_multi_query_heads_share_one_key_value_head():
    rng = np.random.default_rng(1)
    q, k, v = rng.normal(size=(4, 3, 2)), rng.normal(size=(1, 5, 2)), rng.normal(size=(1, 5, 2))
    heads, weights = grouped_heads(q, k, v)
    for h in range(4):
        scores = q[h] @ k[0].T / np.sqrt(2)
        w = np.exp(scores) / np.exp(scores).sum(-1, keepdims=True)
        np.testing.assert_allclose(weights[h], w, atol=1e-14)
        np.testing.assert_allclose(heads[h], w @ v[0], atol=1e-14)


# -- the torch attention against the reference -------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_equals_reference(n_kv_heads, need_weights):
    m = randomize(MultiHeadAttention(16, 4, causal=True, n_kv_heads=n_kv_heads).double())
    assert m.in_proj.weight.shape == (16 + 2 * n_kv_heads * 4, 16)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    out, weights = m(x, need_weights=need_weights)
    p = gqa_params(m)
    for b in range(2):
        expected, w = ref.grouped_query_attention(np_(x[b]), p["w_q"], p["w_k"], p["w_v"], p["w_o"], 4, n_kv_heads,
                                                  ref.causal_mask(7), (p["b_q"], p["b_k"], p["b_v"], p["b_o"]))
        np.testing.assert_allclose(np_(out[b]), expected, atol=TOL)
        if need_weights:
            assert weights.shape == (2, 4, 7, 7)  # one row of weights per query head
            np.testing.assert_allclose(np_(weights[b]), w, atol=TOL)


@pytest.mark.parametrize("qk_norm", [True, False])
def test_attention_with_rotary_base_and_qk_norm_equals_reference(qk_norm):
    rope = RotaryEmbedding(4, max_positions=16, base=100000.0)
    m = randomize(MultiHeadAttention(16, 4, causal=True, rotary=rope, qk_norm=qk_norm, n_kv_heads=2).double())
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    out, weights = m(x, need_weights=True)
    expected, w = mref.self_attention(np_(x[0]), gqa_params(m), 4, ref.causal_mask(6), np.arange(6), qk_norm,
                                      n_kv_heads=2, rope_base=100000.0)
    np.testing.assert_allclose(np_(out[0]), expected, atol=TOL)
    np.testing.assert_allclose(np_(weights[0]), w, atol=TOL)
    torch.testing.assert_close(m(x).output, out, atol=1e-12, rtol=0)  # the fused path gives the same


def test_padding_and_explicit_masks_on_both_paths():
    m = randomize(MultiHeadAttention(12, 6, n_kv_heads=3)).eval()
    x = torch.randn(3, 5, 12)
    pad = torch.ones(3, 5, dtype=torch.bool)
    pad[1, 3:] = False
    extra = torch.rand(1, 1, 5, 5) > 0.3
    extra[..., 0] = True
    for kwargs in ({"key_padding_mask": pad}, {"attn_mask": extra}, {"key_padding_mask": pad, "attn_mask": extra}):
        explicit = m(x, need_weights=True, **kwargs).output
        torch.testing.assert_close(m(x, **kwargs).output, explicit, atol=1e-5, rtol=1e-5)
    assert torch.all(m(x, key_padding_mask=pad, need_weights=True).weights[1, :, :, 3:] == 0)


@pytest.mark.parametrize("n_kv_heads", [1, 3, 6])
def test_one_query_decode_path_equals_the_explicit_heads_under_every_mask_shape(n_kv_heads):
    """A decoding step (one query, cached keys) takes decode_attention on CPU: the heads of the written-out
    equation (float64, 1e-12) under a padding mask, a per-head mask, a 3-D mask and none; a row that may attend to
    nothing gets zeros."""
    from lmforge.nn.attention import decode_attention, explicit_attention

    g = torch.Generator().manual_seed(3)
    q = torch.randn(4, 6, 1, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(4, n_kv_heads, 9, 8, generator=g, dtype=torch.float64) for _ in range(2))
    pad = torch.rand(4, 1, 1, 9, generator=g) > 0.4
    pad[:, ..., 0], pad[3] = True, False  # row 3 sees nothing
    per_head = torch.rand(4, 6, 1, 9, generator=g) > 0.4
    per_head[..., 0] = True
    three_d = torch.rand(6, 1, 9, generator=g) > 0.4  # broadcast as (H, T, S)
    three_d[..., 0] = True
    for mask in (pad, per_head, three_d, None):
        expected, _ = explicit_attention(q, k, v, mask, 0.35, 0.0)
        torch.testing.assert_close(decode_attention(q, k, v, mask, 0.35), expected, atol=1e-12, rtol=0)
    assert torch.all(decode_attention(q, k, v, pad, 0.35)[3] == 0)
    m = randomize(MultiHeadAttention(12, 6, causal=True, n_kv_heads=n_kv_heads)).eval()
    x = torch.randn(2, 5, 12, generator=g)
    explicit = m(x, need_weights=True).output[:, -1]  # the last position attends over all 5
    cache = m.new_cache(2, 8, torch.float32, torch.device("cpu"))
    m(x[:, :4], cache=cache)
    torch.testing.assert_close(m(x[:, 4:], cache=cache).output[:, 0], explicit, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_one_query_decode_path_gives_a_row_the_same_bits_whatever_its_neighbours_and_columns(threads):
    """What the engine's batched == alone rests on: a row's heads do not depend on the batch's size, on columns
    beyond the row's own (a lone request steps fewer capacity columns) or on the thread count (a lone step runs
    on one thread, a full one on two)."""
    from lmforge.nn.attention import decode_attention

    g = torch.Generator().manual_seed(4)
    q = torch.randn(20, 9, 1, 64, generator=g)
    k, v = (torch.randn(20, 3, 512, 64, generator=g) for _ in range(2))
    lengths = torch.randint(1, 60, (20,), generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = [decode_attention(q[i:i + 1], k[i:i + 1, :, :64], v[i:i + 1, :, :64],
                                  torch.arange(64)[None, None, None, :] <= lengths[i], 0.125) for i in range(20)]
        torch.set_num_threads(threads)
        for rows, columns in ((4, 64), (16, 128), (20, 512)):
            visible = (torch.arange(columns)[None, :] <= lengths[:rows, None])[:, None, None, :]  # (B, 1, 1, C)
            out = decode_attention(q[:rows], k[:rows, :, :columns], v[:rows, :, :columns], visible, 0.125)
            assert all(torch.equal(out[i], alone[i][0]) for i in range(rows)), (rows, columns)
    finally:
        torch.set_num_threads(before)


def test_bad_grouping_is_refused():
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(12, 6, n_kv_heads=4)
    with pytest.raises(LmforgeError, match="n_heads=4 is not divisible by n_kv_heads=3"):
        tiny(n_heads=4, d_model=16, n_kv_heads=3)
    with pytest.raises(LmforgeError, match="n_kv_heads: must be >= 1"):
        DecoderConfig.from_dict({"vocab_size": 10, "n_kv_heads": 0})
    with pytest.raises(LmforgeError, match="rope_base: must be > 0"):
        tiny(rope_base=0.0)


# -- the whole Decoder against the reference ----------------------------------------------------------------------
@pytest.mark.parametrize("n_kv_heads", [1, 2, None])
def test_llama_decoder_equals_reference(n_kv_heads):
    c = tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=n_kv_heads)
    model = randomize(Decoder(c).double()).eval()
    ids = torch.randint(0, c.vocab_size, (2, 9))
    logits = model(ids).logits
    for b in range(2):
        expected = mref.decoder(np_(ids[b]), gqa_decoder_params(model), c.n_heads, c.norm, c.activation, rotary=True,
                                eps=c.eps, n_kv_heads=n_kv_heads, rope_base=c.rope_base)
        np.testing.assert_allclose(np_(logits[b]), expected, atol=TOL)


def test_rope_base_changes_the_model():
    c = tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=2)
    model = randomize(Decoder(c).double()).eval()
    other = Decoder(tiny(**{**LLAMA, "rope_base": 10000.0}, d_model=16, n_heads=4, n_kv_heads=2)).double().eval()
    other.load_state_dict(model.state_dict())
    ids = torch.randint(0, c.vocab_size, (1, 9))
    assert (model(ids).logits - other(ids).logits).abs().max() > 1e-3


def test_cached_decoding_equals_full_forward_and_stores_kv_heads_only():
    c = tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=2)
    model = randomize(Decoder(c).double(), seed=1).eval()
    x = torch.randint(0, c.vocab_size, (2, 10))
    full = model(x).logits
    caches = model.new_caches(2, 10)
    assert caches[0].self_attention.k.shape == (2, 2, 10, 4)  # (B, H_kv, max_len, d): half of MHA's
    steps = [model(x[:, :4], caches=caches).logits] + [model(x[:, t: t + 1], caches=caches).logits
                                                      for t in range(4, 10)]
    np.testing.assert_allclose(np_(torch.cat(steps, dim=1)), np_(full), atol=TOL)
    mha = Decoder(tiny(**LLAMA, d_model=16, n_heads=4)).new_caches(2, 10)
    assert mha[0].self_attention.k.numel() == 2 * caches[0].self_attention.k.numel()


def test_generation_cached_equals_uncached_and_compiled():
    model = randomize(Decoder(tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=1)), seed=3).eval()
    prompt = torch.randint(0, 50, (2, 4))
    cached = generate(model, prompt, max_new_tokens=8, use_cache=True)
    uncached = generate(model, prompt, max_new_tokens=8, use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens) and cached.tokens.shape == (2, 8)
    compiled = generate(model, prompt, max_new_tokens=8, compile=True)
    assert torch.equal(compiled.tokens, cached.tokens)


def test_cross_attention_layer_with_grouped_heads_caches():
    layer = randomize(TransformerLayer(8, 4, 16, norm_position="pre", causal=True, cross_attention=True,
                                       n_kv_heads=2)).eval()
    assert layer.cross_attn.kv_proj.weight.shape == (2 * 2 * 2, 8)
    x, memory = torch.randn(2, 6, 8), torch.randn(2, 5, 8)
    full = layer(x, memory)
    cache = layer.new_cache(2, max_len=6, memory_len=5, dtype=x.dtype, device=x.device)
    steps = [layer(x[:, :3], memory, cache=cache).hidden] + [layer(x[:, t: t + 1], memory, cache=cache).hidden
                                                             for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full.hidden, atol=1e-5, rtol=1e-5)
    weights = layer(x, memory, need_weights=True)
    assert weights.self_attention.shape == (2, 4, 6, 6) and weights.cross_attention.shape == (2, 4, 6, 5)


# -- the config, saving, export, training ----------------------------------------------------------------------
def test_config_round_trip_save_load_and_gpt2_export_refused(tmp_path):
    c = tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=2)
    assert DecoderConfig.from_dict(c.to_dict()) == c
    assert "n_kv_heads=2" in c.non_gpt2_settings()
    assert DecoderConfig(vocab_size=10).n_kv_heads is None and DecoderConfig(vocab_size=10).rope_base == 10000.0
    model = randomize(Decoder(c), seed=5).eval()
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (1, 6))
    assert loaded.config == c
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits, atol=0, rtol=0)


def test_muon_splits_follow_the_grouped_blocks():
    model = Decoder(tiny(**LLAMA, d_model=16, n_heads=4, n_kv_heads=1))
    splits = hidden_matrices(model)
    attn = model.layers[0].self_attn
    assert splits[id(attn.in_proj.weight)] == (16, 4, 4)  # W_q: H d rows; W_k, W_v: H_kv d rows each
    assert splits[id(model.layers[0].ffn.fc1.weight)] == (24, 24)
