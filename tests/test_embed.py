"""Embeddings: layer choice, scalar mix, pooling without padding, word vectors, neighbours, analogies, CLI."""

import io
import json

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.models import build_model, get_preset, save_pretrained
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.workflows.embed import (
    analogy,
    candidate_ids,
    cosine,
    embed,
    input_embeddings,
    mix_layers,
    most_similar,
    rank_texts,
    text_analogy,
    word_vector,
)

CORPUS = ["the king spoke to the queen", "a man and a woman walked home", "Juventus lost from Ajax",
          "they were too strong", "unbelievably long sentences about kings and queens"] * 3
TEXTS = ["the king spoke", "a woman walked home to the queen and the king", "Ajax", "they were too strong"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("embed-models")
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=120, min_frequency=1)
    bb = ByteLevelBPETokenizer.train(CORPUS, vocab_size=290, min_frequency=1)
    out = {}
    for name, preset, tok in (("encoder", "bert-tiny", wp), ("decoder", "gpt-tiny", bb),
                              ("seq2seq", "seq2seq-tiny", wp)):
        torch.manual_seed(0)
        model = build_model(get_preset(preset, vocab_size=tok.vocab_size, max_positions=64))
        out[name] = save_pretrained(model.eval(), root / name, tok)
    return out


def states(model, tok, text):
    ids = torch.tensor([tok.encode(text).ids])
    with torch.no_grad():
        return model(ids, output_hidden_states=True).hidden_states  # L + 1 of (1, T, D)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "seq2seq"])
def test_batches_of_different_lengths_equal_one_by_one(dirs, kind):
    model, tok = lmforge.load(dirs[kind])
    for pooling in ("mean", "cls", "last"):
        batched = embed(model, tok, TEXTS, pooling=pooling, batch_size=8)
        alone = embed(model, tok, TEXTS, pooling=pooling, batch_size=1)
        assert batched.shape == (4, 64) and batched.dtype == np.float32
        np.testing.assert_allclose(batched, alone, atol=2e-5)


def test_layer_choice_is_hidden_states_of_that_layer(dirs):
    model, tok = lmforge.load(dirs["encoder"])
    hs = states(model, tok, TEXTS[1])
    for layer in (0, 1, 2, -1):
        got = embed(model, tok, [TEXTS[1]], layer=layer, pooling="cls")[0]
        np.testing.assert_allclose(got, hs[layer][0, 0].numpy(), atol=1e-6)
    mean = embed(model, tok, [TEXTS[1]], layer=1)[0]
    np.testing.assert_allclose(mean, hs[1][0].mean(0).numpy(), atol=1e-6)
    np.testing.assert_allclose(embed(model, tok, [TEXTS[1]])[0], hs[-1][0].mean(0).numpy(), atol=1e-6)
    with pytest.raises(LmforgeError, match=r"--layer: 3 is out of range.*0\.\.2"):
        embed(model, tok, TEXTS, layer=3)
    with pytest.raises(LmforgeError, match="--layer and --mix"):
        embed(model, tok, TEXTS, layer=1, mix=True)


def test_scalar_mix_one_hot_uniform_and_gamma(dirs):
    model, tok = lmforge.load(dirs["encoder"])
    for layer in range(3):
        one_hot = [1.0 if j == layer else 0.0 for j in range(3)]
        np.testing.assert_array_equal(embed(model, tok, TEXTS, mix=True, mix_weights=one_hot),
                                      embed(model, tok, TEXTS, layer=layer))
    per_layer = np.stack([embed(model, tok, TEXTS, layer=j) for j in range(3)])  # (3, N, D)
    np.testing.assert_allclose(embed(model, tok, TEXTS, mix=True), per_layer.mean(0), atol=1e-5)
    np.testing.assert_allclose(embed(model, tok, TEXTS, mix=True, mix_weights=[2, 1, 1], gamma=2.0),
                               2.0 * (0.5 * per_layer[0] + 0.25 * per_layer[1] + 0.25 * per_layer[2]), atol=1e-5)
    hs = [torch.full((1, 1, 2), float(v)) for v in (0, 3, 6)]
    assert mix_layers(hs)[0, 0].tolist() == pytest.approx([3.0, 3.0])
    with pytest.raises(LmforgeError, match="--mix-weights: the model has 3 layers"):
        embed(model, tok, TEXTS, mix=True, mix_weights=[1, 0])
    with pytest.raises(LmforgeError, match="non-negative"):
        embed(model, tok, TEXTS, mix=True, mix_weights=[1, -1, 1])


def test_exclude_special_leaves_cls_and_sep_out(dirs):
    model, tok = lmforge.load(dirs["encoder"])
    h = states(model, tok, TEXTS[0])[-1][0]  # (T, D): [CLS] ... [SEP]
    got = embed(model, tok, TEXTS[:1], exclude_special=True)[0]
    np.testing.assert_allclose(got, h[1:-1].mean(0).numpy(), atol=1e-6)
    assert not np.allclose(got, embed(model, tok, TEXTS[:1])[0], atol=1e-4)


def test_last_pooling_reads_the_last_real_token_of_a_decoder(dirs):
    model, tok = lmforge.load(dirs["decoder"])
    got = embed(model, tok, TEXTS, pooling="last", batch_size=4)
    for row, text in enumerate(TEXTS):
        np.testing.assert_allclose(got[row], states(model, tok, text)[-1][0, -1].numpy(), atol=2e-5)


def test_word_vectors_neighbours_and_analogy(dirs):
    model, tok = lmforge.load(dirs["encoder"])
    e = input_embeddings(model)
    assert e.shape == (tok.vocab_size, 64)
    pieces = tok.encode("kingsman", add_special_tokens=False).ids
    assert len(pieces) > 1  # a multi-piece word is the mean of its pieces' rows
    torch.testing.assert_close(word_vector(model, tok, "kingsman"), e[pieces].mean(0))
    near = most_similar(model, tok, "king", k=5)
    assert len(near) == 5 and "king" not in [t for t, _ in near]
    assert [c for _, c in near] == sorted((c for _, c in near), reverse=True)
    ids = candidate_ids(tok).tolist()
    assert not any(tok.id_to_token[i].startswith("##") or i in tok.special_ids for i in ids)
    best = analogy(model, tok, "man", "king", "woman", k=3)
    assert not {"man", "king", "woman"} & {t for t, _ in best}
    target = e[tok.token_to_id("king")] - e[tok.token_to_id("man")] + e[tok.token_to_id("woman")]
    assert best[0][1] == pytest.approx(cosine(target, e[tok.token_to_id(best[0][0])]), abs=1e-5)
    assert rank_texts(np.array([1.0, 0.0]), np.array([[0.0, 1.0], [2.0, 0.1], [-1.0, 0.0]]))[0][0] == 1


def test_text_analogy_ranks_the_corpus_by_b_minus_a_plus_c(dirs):
    model, tok = lmforge.load(dirs["encoder"])
    a, b, c = TEXTS[:3]
    corpus = [*TEXTS, "the queen spoke"]
    found = text_analogy(model, tok, a, b, c, corpus, k=10, pooling="cls")
    assert [t for t, _ in found] and not {a, b, c} & {t for t, _ in found}  # the inputs never come back
    v = embed(model, tok, [a, b, c], pooling="cls")
    target = v[1] - v[0] + v[2]
    for text, cos in found:
        assert cos == pytest.approx(cosine(target, embed(model, tok, [text], pooling="cls")[0]), abs=1e-5)
    assert [c for _, c in found] == sorted((c for _, c in found), reverse=True)


def test_cli_embed_npy_jsonl_stdout_and_queries(dirs, tmp_path, monkeypatch, capsys):
    model_dir = str(dirs["encoder"])
    out = tmp_path / "v.npy"
    assert main(["embed", "--model", model_dir, "--out", str(out), *TEXTS]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "shape": [4, 64], "layer": "last",
                                                   "pooling": "mean"}
    model, tok = lmforge.load(dirs["encoder"])
    np.testing.assert_array_equal(np.load(out), embed(model, tok, TEXTS))
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(TEXTS) + "\n\n"))
    out = tmp_path / "v.jsonl"
    assert main(["embed", "--model", model_dir, "--mix", "--mix-weights", "0,1,0", "--pooling", "cls",
                 "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["text"] for r in rows] == TEXTS
    np.testing.assert_allclose([r["embedding"] for r in rows], embed(model, tok, TEXTS, layer=1, pooling="cls"),
                               atol=1e-6)
    capsys.readouterr()
    assert main(["embed", "--model", model_dir, "Ajax"]) == 0
    assert len(json.loads(capsys.readouterr().out)["embedding"]) == 64
    assert main(["embed", "--model", model_dir, "--similar", "king", "-k", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["embed", "--model", model_dir, "--analogy", "man", "king", "woman", "-k", "2"]) == 0
    assert [json.loads(x)["token"] for x in capsys.readouterr().out.splitlines()] == [
        t for t, _ in analogy(model, tok, "man", "king", "woman", k=2)]
    assert main(["embed", "--model", model_dir, "--analogy", *TEXTS[:3], *TEXTS]) == 0
    assert [json.loads(x)["text"] for x in capsys.readouterr().out.splitlines()] == [TEXTS[3]]
    assert main(["embed", "--model", model_dir, "--query", "they were too strong", *TEXTS]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0]) == {"text": "they were too strong", "cosine": 1.0}
    assert main(["embed", "--model", model_dir, "--layer", "9", "x"]) == 2
    assert "--layer: 9" in capsys.readouterr().err
    assert main(["embed", "--model", model_dir, "--mix-weights", "1,0,0", "x"]) == 2
    assert main(["embed", "--model", model_dir, "--out", str(tmp_path / "v.csv"), "x"]) == 2
