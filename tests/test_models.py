"""Configs, the three models and their heads, parameter counts, model directories."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.models import (
    PRESETS,
    Decoder,
    DecoderConfig,
    Encoder,
    EncoderConfig,
    EncoderForPreTraining,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
    Seq2Seq,
    Seq2SeqConfig,
    count_parameters,
    get_preset,
    load_config,
    load_pretrained,
    save_pretrained,
)

torch.manual_seed(0)


def tiny(name: str, **kw):
    return get_preset(name, dropout=0.0, attention_dropout=0.0, **kw)


# -- configs ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_round_trips_through_config_json(tmp_path, name):
    config = get_preset(name)
    assert type(config).from_dict(config.to_dict()) == config
    path = config.save(tmp_path)
    assert path.name == "config.json"
    assert type(config).load(tmp_path) == config
    assert load_config(path) == config
    assert json.loads(path.read_text())["kind"] == config.kind


def test_config_errors_name_the_field(tmp_path):
    with pytest.raises(LmforgeError, match=r"n_embd: unknown key; did you mean n_heads\?"):
        DecoderConfig.from_dict({"vocab_size": 10, "n_embd": 4})
    with pytest.raises(LmforgeError, match="d_model=10 is not divisible by n_heads=4"):
        get_preset("bert-tiny", d_model=10)
    with pytest.raises(LmforgeError, match="unknown preset 'gpt5'"):
        get_preset("gpt5")
    with pytest.raises(LmforgeError, match="kind is 'decoder', expected 'encoder'"):
        EncoderConfig.from_dict(DecoderConfig(vocab_size=5).to_dict())
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(LmforgeError, match=r"config.json: not valid JSON"):
        load_config(tmp_path)


def test_get_preset_returns_a_copy():
    get_preset("gpt-tiny", n_layers=7)
    assert PRESETS["gpt-tiny"].n_layers == 2


# -- parameter counts -------------------------------------------------------------------------------
def test_bert_base_has_109482240_parameters_without_heads():
    with torch.device("meta"):  # shapes only: no memory, no initialisation time
        counts = count_parameters(Encoder(get_preset("bert-base")))
    assert counts["total"] == 109_482_240  # the paper's "110M"
    assert counts == {"embeddings": 23_837_184, "layers": 85_054_464, "pooler": 590_592, "heads": 0,
                      "total": 109_482_240}


def test_bert_large_and_gpt2_counts():
    with torch.device("meta"):
        assert count_parameters(Encoder(get_preset("bert-large")), by_component=False) == 335_141_888  # "340M"
        gpt2 = count_parameters(Decoder(get_preset("gpt2")))
    assert gpt2["total"] == 124_439_808 and gpt2["heads"] == 0  # tied head counted once


def test_pretraining_heads_counted_apart():
    counts = count_parameters(EncoderForPreTraining(get_preset("bert-tiny")))
    d, v = 64, 1000
    assert counts["heads"] == (d * d + d) + 2 * d + v + (2 * d + 2)  # transform, LN, MLM bias, NSP


# -- the three models -------------------------------------------------------------------------------
def test_decoder_shapes_loss_and_tied_head():
    model = Decoder(tiny("gpt-tiny")).eval()
    x = torch.randint(0, 1000, (2, 9))
    out = model(x, labels=x, output_hidden_states=True, output_attentions=True)
    assert out.logits.shape == (2, 9, 1000)
    assert model.lm_head.proj.weight is model.tok_emb.weight
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 1000), x[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert len(out.hidden_states) == 3 and len(out.attentions) == 2
    assert out.attentions[0].shape == (2, 4, 9, 9)
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert model(x).attentions is None and model(x).hidden_states is None


def test_decoder_label_minus_100_is_ignored():
    model = Decoder(tiny("gpt-tiny")).eval()
    x = torch.randint(0, 1000, (1, 6))
    labels = x.clone()
    labels[0, 3:] = -100
    expected = torch.nn.functional.cross_entropy(model(x).logits[0, :2], x[0, 1:3])
    torch.testing.assert_close(model(x, labels=labels).loss, expected)


def test_decoder_is_causal_and_cache_matches_full_pass():
    model = Decoder(tiny("gpt-tiny")).eval()
    x = torch.randint(0, 1000, (2, 8))
    y = x.clone()
    y[:, 5] = (y[:, 5] + 1) % 1000
    full = model(x).logits
    torch.testing.assert_close(model(y).logits[:, :5], full[:, :5])
    caches = model.new_caches(2, 8)
    steps = [model(x[:, :5], caches=caches).logits] + [model(x[:, t : t + 1], caches=caches).logits
                                                      for t in range(5, 8)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)


def test_decoder_left_padding_with_position_ids():
    model = Decoder(tiny("gpt-tiny")).eval()
    x = torch.randint(1, 1000, (1, 5))
    padded = torch.cat([torch.zeros(1, 2, dtype=torch.long), x], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(padded, attention_mask=mask, position_ids=pos).logits[:, 2:]
    torch.testing.assert_close(out, model(x).logits, atol=1e-5, rtol=1e-5)


def test_encoder_padding_does_not_change_real_tokens():
    model = Encoder(tiny("bert-tiny")).eval()
    x = torch.randint(5, 1000, (1, 6))
    padded = torch.cat([x, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 6 + [0] * 3])
    a = model(x)
    b = model(padded, attention_mask=mask)
    torch.testing.assert_close(b.last_hidden_state[:, :6], a.last_hidden_state, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(b.pooled, a.pooled, atol=1e-5, rtol=1e-5)


def test_segments_change_the_output():
    model = Encoder(tiny("bert-tiny")).eval()
    x = torch.randint(5, 1000, (1, 6))
    types = torch.tensor([[0, 0, 0, 1, 1, 1]])
    assert not torch.allclose(model(x).last_hidden_state, model(x, token_type_ids=types).last_hidden_state)
    torch.testing.assert_close(model(x).pooled, model(x, token_type_ids=torch.zeros_like(x)).pooled)


def test_seq2seq_decoder_is_causal_and_ignores_padded_source():
    model = Seq2Seq(tiny("seq2seq-tiny")).eval()
    src = torch.randint(3, 1000, (2, 7))
    tgt = torch.randint(3, 1000, (2, 6))
    base = model(src, tgt).logits
    changed = tgt.clone()
    changed[:, 4] = (changed[:, 4] + 1) % 1000  # target token t+1 = 4
    torch.testing.assert_close(model(src, changed).logits[:, :4], base[:, :4])
    assert not torch.allclose(model(src, changed).logits[:, 4:], base[:, 4:])
    padded = torch.cat([src, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = torch.cat([torch.ones(2, 7), torch.zeros(2, 3)], dim=1)
    torch.testing.assert_close(model(padded, tgt, src_mask=mask).logits, base, atol=1e-5, rtol=1e-5)
    other_pad = padded.clone()
    other_pad[:, 7:] = 42  # whatever sits in the padded slots
    torch.testing.assert_close(model(other_pad, tgt, src_mask=mask).logits, base, atol=1e-5, rtol=1e-5)


def test_seq2seq_shared_embeddings_loss_and_cache():
    model = Seq2Seq(tiny("seq2seq-tiny")).eval()
    assert model.lm_head.proj.weight is model.embed.weight
    src, y = torch.randint(3, 1000, (2, 5)), torch.randint(3, 1000, (2, 4))
    tgt = torch.cat([torch.ones(2, 1, dtype=torch.long), y[:, :-1]], dim=1)
    out = model(src, tgt, labels=y, output_attentions=True)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, 1000), y.reshape(-1))
    torch.testing.assert_close(out.loss, expected)
    assert out.cross_attentions[0].shape == (2, 4, 4, 5)
    memory = model.encode(src).last_hidden_state
    caches = model.new_caches(2, 4, 5)
    steps = [model.decode(tgt[:, t : t + 1], memory, caches=caches).logits for t in range(4)]
    torch.testing.assert_close(torch.cat(steps, 1), out.logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "seq2seq"])
def test_explicit_and_fast_attention_paths_agree(kind):
    x = torch.randint(3, 1000, (2, 7))
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    if kind == "encoder":
        model = Encoder(tiny("bert-tiny")).eval()
        fast, slow = model(x, mask), model(x, mask, output_attentions=True)
        a, b = fast.last_hidden_state, slow.last_hidden_state
    elif kind == "decoder":
        model = Decoder(tiny("gpt-tiny")).eval()
        fast, slow = model(x, mask), model(x, mask, output_attentions=True)
        a, b = fast.logits, slow.logits
    else:
        model = Seq2Seq(tiny("seq2seq-tiny")).eval()
        fast, slow = model(x, x[:, :5], src_mask=mask), model(x, x[:, :5], src_mask=mask, output_attentions=True)
        a, b = fast.logits, slow.logits
        assert slow.cross_attentions[0][1, :, :, 4:].abs().max() == 0  # padded source gets no weight
    assert fast.attentions is None and slow.attentions is not None
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for w in slow.attentions:
        torch.testing.assert_close(w.sum(-1)[0], torch.ones_like(w.sum(-1)[0]))


def test_heads_losses():
    c = tiny("bert-tiny")
    x = torch.randint(5, 1000, (2, 6))
    pre = EncoderForPreTraining(c).eval()
    assert pre.mlm.decoder.weight is pre.encoder.embeddings.tok_emb.weight
    labels = torch.full_like(x, -100)
    labels[:, 2] = x[:, 2]
    out = pre(x, labels=labels, next_sentence_label=torch.tensor([0, 1]))
    full = pre(x).logits
    assert full.shape == (2, 6, 1000) and out.next_sentence_logits.shape == (2, 2)
    assert out.logits.shape == (2, 1000)  # with labels: only the labelled positions are scored
    torch.testing.assert_close(out.logits, full[:, 2], atol=1e-5, rtol=1e-5)
    mlm = torch.nn.functional.cross_entropy(full[:, 2], x[:, 2])
    nsp = torch.nn.functional.cross_entropy(out.next_sentence_logits, torch.tensor([0, 1]))
    torch.testing.assert_close(out.loss, mlm + nsp, atol=1e-5, rtol=1e-5)
    assert out.metrics["mlm_accuracy"] == float((full[:, 2].argmax(-1) == x[:, 2]).float().mean())
    seq = EncoderForSequenceClassification(c, num_labels=3).eval()
    out = seq(x, labels=torch.tensor([0, 2]))
    assert out.logits.shape == (2, 3) and out.loss.ndim == 0
    tok = EncoderForTokenClassification(c, num_labels=5).eval()
    out = tok(x, labels=torch.full_like(x, -100).index_fill(1, torch.tensor([1]), 4))
    assert out.logits.shape == (2, 6, 5)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[:, 1], torch.full((2,), 4)))


# -- bad input --------------------------------------------------------------------------------------
def test_too_long_inputs_raise_a_clear_error():
    model = Decoder(tiny("gpt-tiny", max_positions=8)).eval()
    with pytest.raises(LmforgeError, match="input has 9 positions but the model's max_positions is 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
    enc = Encoder(tiny("bert-tiny", max_positions=8)).eval()
    with pytest.raises(LmforgeError, match="max_positions is 8"):
        enc(torch.zeros(1, 9, dtype=torch.long))
    s2s = Seq2Seq(tiny("seq2seq-tiny", max_positions=8)).eval()
    with pytest.raises(LmforgeError, match="source has 9 positions"):
        s2s(torch.zeros(1, 9, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))
    caches = model.new_caches(1, 8)
    model(torch.zeros(1, 8, dtype=torch.long), caches=caches)
    with pytest.raises(LmforgeError, match="9 positions"):
        model(torch.zeros(1, 1, dtype=torch.long), caches=caches)


# -- model directories ------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda: Decoder(tiny("gpt-tiny")),
    lambda: EncoderForPreTraining(tiny("bert-tiny")),
    lambda: EncoderForSequenceClassification(tiny("bert-tiny"), num_labels=3),
    lambda: Seq2Seq(tiny("seq2seq-tiny")),
])
def test_save_and_load_pretrained(tmp_path, make):
    model = make().eval()
    save_pretrained(model, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checksums.json", "config.json", "model.safetensors"]
    loaded = load_pretrained(tmp_path)
    assert type(loaded) is type(model) and loaded.config == model.config
    for (k, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), k
    x = torch.randint(3, 1000, (1, 5))
    if isinstance(model, Seq2Seq):
        torch.testing.assert_close(loaded(x, x).logits, model(x, x).logits)
    else:
        torch.testing.assert_close(loaded(x).logits, model(x).logits)


def test_checkpoint_that_does_not_fit_the_config_names_tensor_and_shapes(tmp_path):
    save_pretrained(Decoder(tiny("gpt-tiny")), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["d_ff"] = 128
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(LmforgeError, match=r"tensor 'layers.0.ffn.fc1.weight' has shape \(256, 64\) "
                                           r"but the config expects \(128, 64\)"):
        load_pretrained(tmp_path)


def test_config_classes_are_the_three_kinds():
    assert {EncoderConfig(5).kind, DecoderConfig(5).kind, Seq2SeqConfig(5).kind} == {"encoder", "decoder", "seq2seq"}
