"""The modern decoder's switches (docs/modern.md): each piece against the NumPy reference in float64 (1e-10),
the whole Decoder against the reference decoder, and the decoder's uses (KV cache, attention weights,
save/load, Hugging Face export refused, the two recipes from YAML)."""

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from lmforge import reference as ref
from lmforge.errors import LmforgeError
from lmforge.models import Decoder, DecoderConfig, get_preset, load_pretrained, save_pretrained
from lmforge.models.decoder import soft_cap
from lmforge.nn import FeedForward, MultiHeadAttention, RMSNorm, RotaryEmbedding, TransformerLayer
from lmforge.reference import modern as mref
from test_nn import randomize  # random values in every parameter (zero-initialised ones too)

TOL = 1e-10
CONFIGS = Path(__file__).resolve().parent.parent / "configs"
MODERN = dict(norm="rmsnorm", positions="rotary", qk_norm=True, activation="relu2", bias=False,
              tie_embeddings=False, logit_softcap=15.0, zero_init_projections=True)


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


def attention_params(m: MultiHeadAttention) -> dict:
    qk = m.n_heads * m.d_qk
    w_q, w_k, w_v = np.split(np_(m.in_proj.weight), [qk, 2 * qk])
    p = dict(w_q=w_q, w_k=w_k, w_v=w_v, w_o=np_(m.out_proj.weight))
    if m.in_proj.bias is not None:
        p.update(zip(("b_q", "b_k", "b_v"), np.split(np_(m.in_proj.bias), [qk, 2 * qk]), strict=True))
        p["b_o"] = np_(m.out_proj.bias)
    if m.q_norm is not None:
        p.update(g_q=np_(m.q_norm.weight), g_k=np_(m.k_norm.weight))
    return p


def layer_params(layer: TransformerLayer) -> dict:
    p = attention_params(layer.self_attn)
    for ours, theirs in (("n1", layer.norm1), ("n2", layer.norm2)):
        p[f"{ours}_g"] = np_(theirs.weight)
        if getattr(theirs, "bias", None) is not None:
            p[f"{ours}_b"] = np_(theirs.bias)
    p.update(w_1=np_(layer.ffn.fc1.weight), w_2=np_(layer.ffn.fc2.weight))
    if layer.ffn.fc1.bias is not None:
        p.update(b_1=np_(layer.ffn.fc1.bias), b_2=np_(layer.ffn.fc2.bias))
    return p


def decoder_params(model: Decoder) -> dict:
    p = dict(tok_emb=np_(model.tok_emb.weight), layers=[layer_params(layer) for layer in model.layers],
             nf_g=np_(model.norm_f.weight), w_out=np_(model.lm_head.proj.weight))
    if model.pos_emb is not None:
        p["pos_emb"] = np_(model.pos_emb.embedding.weight)
    if getattr(model.norm_f, "bias", None) is not None:
        p["nf_b"] = np_(model.norm_f.bias)
    return p


def tiny(**switches) -> DecoderConfig:
    shape = dict(vocab_size=50, d_model=16, n_layers=2, n_heads=2, d_ff=24, max_positions=32, dropout=0.0,
                 attention_dropout=0.0)
    return get_preset("gpt-tiny", **{**shape, **switches})


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# -- the reference by hand ---------------------------------------------------------------------------------------
def test_reference_rms_norm_relu2_swiglu_soft_cap_by_hand():
    x = np.array([[3.0, -4.0, 0.0, 1.0]])
    y = mref.rms_norm(x, eps=0.0)
    np.testing.assert_allclose((y**2).mean(-1), 1.0, atol=1e-15)
    np.testing.assert_allclose(y, x / math.sqrt(26 / 4), atol=1e-15)
    np.testing.assert_array_equal(mref.relu_squared(np.array([-2.0, 0.0, 3.0])), [0.0, 0.0, 9.0])
    w_1 = np.array([[1.0], [2.0]])  # gate row, value row; d_ff = 1
    out = mref.swiglu(np.array([[1.5]]), w_1, np.array([[1.0]]))
    assert out[0, 0] == pytest.approx(1.5 / (1 + math.exp(-1.5)) * 3.0, abs=1e-15)
    assert mref.soft_cap(np.array([1e6]), 15.0)[0] == pytest.approx(15.0)
    assert mref.soft_cap(np.array([0.01]), 15.0)[0] == pytest.approx(0.01, rel=1e-6)


def test_reference_rotation_gives_relative_positions_and_keeps_norms():
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(1, 8)), rng.normal(size=(1, 8))

    def score(m: int, n: int) -> float:
        return float((mref.rotate(q, [m]) * mref.rotate(k, [n])).sum())

    assert score(7, 3) == pytest.approx(score(30, 26), abs=1e-12)
    assert score(7, 3) != pytest.approx(score(7, 4), abs=1e-3)
    np.testing.assert_allclose(np.linalg.norm(mref.rotate(q, [11])), np.linalg.norm(q), atol=1e-14)


# -- each torch piece against the reference ---------------------------------------------------------------------
def test_rms_norm_equals_reference():
    norm = randomize(RMSNorm(8, eps=1e-5).double())
    x = torch.randn(3, 5, 8, dtype=torch.float64) * 3
    np.testing.assert_allclose(np_(norm(x)), mref.rms_norm(np_(x), np_(norm.weight), 1e-5), atol=TOL)
    bare = RMSNorm(8, affine=False).double()
    np.testing.assert_allclose(np_(bare(x)), mref.rms_norm(np_(x), None, 1e-5), atol=TOL)


@pytest.mark.parametrize("activation", ["relu2", "swiglu"])
@pytest.mark.parametrize("bias", [True, False])
def test_feed_forward_equals_reference(activation, bias):
    f = randomize(FeedForward(6, 10, activation, bias=bias).double())
    assert f.fc1.weight.shape == ((20 if activation == "swiglu" else 10), 6)
    x = torch.randn(4, 6, dtype=torch.float64)
    biases = dict(b_1=np_(f.fc1.bias), b_2=np_(f.fc2.bias)) if bias else {}
    expected = mref.feed_forward(np_(x), np_(f.fc1.weight), np_(f.fc2.weight), activation, **biases)
    np.testing.assert_allclose(np_(f(x)), expected, atol=TOL)


def test_rotary_equals_reference_in_float64():
    rope = RotaryEmbedding(8, max_positions=40)
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    positions = torch.tensor([0, 1, 7, 20, 39])
    np.testing.assert_allclose(np_(rope(x, positions)), mref.rotate(np_(x), np_(positions)), atol=TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rotary_angles_looked_up_once_give_the_same_bits(dtype, monkeypatch):
    """A decoder looks its angles up once a forward and hands them to every layer: the same bits as each layer
    rotating from the positions itself, for (T,) and (B, T) positions, and angles made in float32 for x in
    bfloat16 (autocast) turn x exactly as a bfloat16 lookup does."""
    rope = RotaryEmbedding(8, max_positions=40)
    x = torch.randn(2, 3, 5, 8).to(dtype)
    for positions in (torch.tensor([0, 1, 7, 20, 39]), torch.tensor([[3, 4, 5, 6, 7], [0, 9, 18, 27, 36]])):
        made = torch.float64 if dtype == torch.float64 else torch.float32
        assert torch.equal(rope(x, rope.angles(positions, made)), rope(x, positions))
    model = Decoder(DecoderConfig(vocab_size=50, d_model=16, n_heads=2, n_layers=3, d_ff=32, max_positions=32,
                                  **MODERN)).eval()
    lookups = []
    looked_up = RotaryEmbedding.angles
    monkeypatch.setattr(RotaryEmbedding, "angles", lambda self, *a: lookups.append(1) or looked_up(self, *a))
    ids = torch.randint(0, 50, (2, 7))
    once = model(ids).logits
    assert len(lookups) == 1  # for 3 layers
    monkeypatch.setattr(model, "rotary", None)  # each layer's attention now rotates from the positions itself
    assert all(layer.self_attn.rotary is not None for layer in model.layers)
    per_layer = model(ids).logits
    assert len(lookups) == 1 + 2 * 3  # queries and keys of each layer
    assert torch.equal(once, per_layer)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("rotary", [True, False])
@pytest.mark.parametrize("need_weights", [True, False])
def test_attention_with_qk_norm_and_rotary_equals_reference(qk_norm, rotary, need_weights):
    rope = RotaryEmbedding(4, max_positions=16) if rotary else None
    m = randomize(MultiHeadAttention(8, 2, causal=True, rotary=rope, qk_norm=qk_norm).double())
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    out = m(x, need_weights=need_weights)
    for b in range(2):
        y, w = mref.self_attention(np_(x[b]), attention_params(m), 2, ref.causal_mask(6),
                                   positions=np.arange(6) if rotary else None, qk_norm=qk_norm)
        np.testing.assert_allclose(np_(out.output[b]), y, atol=TOL)
        if need_weights:
            np.testing.assert_allclose(np_(out.weights[b]), w, atol=TOL)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("activation", ["gelu_tanh", "relu2", "swiglu"])
def test_transformer_layer_switches_equal_reference(norm, activation):
    rope = RotaryEmbedding(4, max_positions=16)
    layer = randomize(TransformerLayer(8, 2, 12, norm_position="pre", activation=activation, causal=True,
                                       bias=False, rotary=rope, norm=norm, qk_norm=True).double()).eval()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    out = layer(x, need_weights=True)
    for b in range(2):
        y, w = mref.decoder_layer(np_(x[b]), layer_params(layer), 2, norm, activation, np.arange(5), qk_norm=True)
        np.testing.assert_allclose(np_(out.hidden[b]), y, atol=TOL)
        np.testing.assert_allclose(np_(out.self_attention[b]), w, atol=TOL)


def test_soft_cap_equals_reference():
    z = torch.randn(3, 7, dtype=torch.float64) * 40
    np.testing.assert_allclose(np_(soft_cap(z, 15.0)), mref.soft_cap(np_(z), 15.0), atol=TOL)
    assert soft_cap(z, 15.0).abs().max() < 15.0


SWITCHES = [{}, dict(norm="rmsnorm"), dict(positions="rotary"), dict(qk_norm=True), dict(activation="relu2"),
            dict(activation="swiglu"), dict(bias=False), dict(tie_embeddings=False), dict(logit_softcap=5.0),
            MODERN, {**MODERN, "activation": "swiglu"}]


@pytest.mark.parametrize("switches", SWITCHES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "gpt2")
def test_whole_decoder_equals_reference(switches):
    c = tiny(**switches)
    model = randomize(Decoder(c).double()).eval()
    ids = torch.randint(0, c.vocab_size, (2, 9))
    logits = model(ids).logits
    for b in range(2):
        expected = mref.decoder(np_(ids[b]), decoder_params(model), c.n_heads, c.norm, c.activation,
                                rotary=c.positions == "rotary", qk_norm=c.qk_norm, logit_softcap=c.logit_softcap)
        np.testing.assert_allclose(np_(logits[b]), expected, atol=TOL)


# -- the config, the defaults, the initialisation ---------------------------------------------------------------
def test_defaults_are_gpt2_and_unchanged():
    c = DecoderConfig(vocab_size=10)
    assert (c.norm, c.positions, c.qk_norm, c.activation, c.bias, c.tie_embeddings, c.logit_softcap,
            c.zero_init_projections) == ("layernorm", "learned", False, "gelu_tanh", True, True, None, False)
    assert c.is_gpt2() and not tiny(**MODERN).is_gpt2()
    names = set(Decoder(tiny()).state_dict())
    assert "pos_emb.embedding.weight" in names and "layers.0.norm1.bias" in names
    assert not any("q_norm" in n or "rotary" in n for n in names)


def test_modern_parameters_and_zero_init():
    model = Decoder(tiny(**MODERN))
    names = set(model.state_dict())
    assert "pos_emb.embedding.weight" not in names and not any(n.endswith(".bias") for n in names)
    assert "layers.0.self_attn.q_norm.weight" in names and "lm_head.proj.weight" in names
    assert model.lm_head.proj.weight is not model.tok_emb.weight
    for layer in model.layers:
        assert not layer.self_attn.out_proj.weight.any() and not layer.ffn.fc2.weight.any()
    ids = torch.randint(0, 50, (2, 8))
    # every layer is the identity and the head is 0: uniform predictions, loss = ln V
    assert model(ids, labels=ids).loss.item() == pytest.approx(math.log(50), abs=1e-6)


def test_bad_switches_are_refused():
    for bad, match in [(dict(norm="batchnorm"), "norm: expected one of layernorm, rmsnorm"),
                       (dict(positions="alibi"), "positions: expected one of learned, rotary"),
                       (dict(activation="tanh"), "activation: expected one of"),
                       (dict(logit_softcap=0.0), "logit_softcap"),
                       (dict(positions="rotary", d_model=12, n_heads=4), "even head width")]:
        with pytest.raises(LmforgeError, match=match):
            tiny(**bad)


# -- where the decoder goes: cache, attention weights, save/load, export ---------------------------------------
@pytest.mark.parametrize("switches", [MODERN, {**MODERN, "activation": "swiglu"}])
def test_kv_cache_equals_full_pass(switches):
    model = randomize(Decoder(tiny(**switches)), seed=1).eval()
    x = torch.randint(0, 50, (2, 10))
    full = model(x).logits
    caches = model.new_caches(2, 10)
    steps = [model(x[:, :4], caches=caches).logits] + [model(x[:, t: t + 1], caches=caches).logits
                                                      for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_left_padded_prompt_with_rotary_positions():
    model = randomize(Decoder(tiny(**MODERN)), seed=2).eval()
    x = torch.randint(1, 50, (1, 5))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), x], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(padded, attention_mask=mask, position_ids=pos).logits[:, 2:]
    torch.testing.assert_close(out, model(x).logits, atol=1e-5, rtol=1e-5)


def test_generation_with_cache_equals_without():
    from lmforge.generation import generate

    model = randomize(Decoder(tiny(**MODERN)), seed=3).eval()
    prompt = torch.randint(0, 50, (2, 4))
    cached = generate(model, prompt, max_new_tokens=8, use_cache=True)
    uncached = generate(model, prompt, max_new_tokens=8, use_cache=False)
    assert torch.equal(cached.tokens, uncached.tokens) and cached.tokens.shape == (2, 8)


def test_attention_weights_for_inspection():
    model = randomize(Decoder(tiny(**MODERN)).double(), seed=4).eval()
    ids = torch.randint(0, 50, (1, 7))
    out = model(ids, output_attentions=True)
    assert len(out.attentions) == 2 and out.attentions[0].shape == (1, 2, 7, 7)
    torch.testing.assert_close(out.logits, model(ids).logits, atol=1e-12, rtol=0)  # fast path == explicit path
    w = out.attentions[1][0]
    np.testing.assert_allclose(np_(w.sum(-1)), 1.0, atol=1e-12)
    assert not w.triu(1).any()  # causal


def test_save_and_load_round_trip(tmp_path):
    model = randomize(Decoder(tiny(**MODERN)), seed=5).eval()
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path).eval()
    assert loaded.config == model.config
    x = torch.randint(0, 50, (1, 6))
    assert torch.equal(loaded(x).logits, model(x).logits)


def test_hugging_face_export_is_refused_for_modern_settings(tmp_path):
    from lmforge.interop import convert_to_hf

    with pytest.raises(LmforgeError) as err:
        convert_to_hf(Decoder(tiny(**MODERN)), tmp_path / "hf")
    message = str(err.value)
    assert "\n" not in message and "rmsnorm" in message and "GPT-2" in message
    assert not (tmp_path / "hf").exists()  # nothing written
    convert_to_hf(Decoder(tiny(tie_embeddings=False, zero_init_projections=True)), tmp_path / "ok")  # still GPT-2


# -- the recipes ---------------------------------------------------------------------------------------------------
def recipe_model(name: str, vocab_size: int = 257) -> Decoder:
    section = dict(yaml.safe_load((CONFIGS / name).read_text())["model"])
    return Decoder(get_preset(section.pop("preset"), vocab_size=vocab_size, **section))


def test_modern_cpu_recipe_matches_the_nanogpt_size():
    base = sum(p.numel() for p in recipe_model("gpt-nanogpt-cpu.yaml").parameters())
    modern = recipe_model("gpt-modern-cpu.yaml")
    assert abs(sum(p.numel() for p in modern.parameters()) / base - 1) <= 0.10
    assert modern.config.max_positions == 64 and not modern.config.is_gpt2()


@pytest.mark.parametrize("name", ["gpt-modern-cpu.yaml", "gpt2-modern.yaml"])
def test_recipe_trains_from_the_command_line(tmp_path, name):
    """Each recipe, shrunk by overrides, pretrains a few Muon steps on a small text and loads back."""
    from lmforge.cli import main

    text = tmp_path / "text.txt"
    text.write_text("To be, or not to be, that is the question.\n" * 60, encoding="utf-8")
    shrink = [] if name == "gpt-modern-cpu.yaml" else [
        "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.d_ff=64", "model.max_positions=32",
        "tokenizer.vocab_size=300", "data.seq_len=32", "train.batch_size=2", "train.precision=fp32",
        "train.compile=false"]
    args = ["pretrain", "--config", str(CONFIGS / name), "--out", str(tmp_path / "run"), f"data.files=[{text}]",
            "train.max_steps=3", "train.warmup_steps=1", "train.eval_every=3", "train.save_every=3",
            "train.progress=false", "train.plot=false", "data.eval_batches=1", *shrink]
    assert main(args) == 0
    model = load_pretrained(tmp_path / "run" / "model")
    assert model.config.positions == "rotary" and model.config.qk_norm
    log = (tmp_path / "run" / "log.jsonl").read_text()
    assert '"eval_loss"' in log


def test_bf16_autocast_runs_the_fused_kernels(recwarn):
    """Under autocast the RMSNorm gain is cast to the input's dtype (else torch falls back, with a warning)."""
    model = Decoder(tiny(**MODERN))
    ids = torch.randint(0, 50, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(ids, labels=ids)
    out.loss.backward()
    assert math.isfinite(out.loss.item()) and model.norm_f.weight.grad.dtype == torch.float32
    assert not [w for w in recwarn if "dtype" in str(w.message)]
