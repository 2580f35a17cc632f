"""Attention maps, PNG heatmaps, the HTML explorer's page (static checks), rollout and plots, on tiny models."""

import itertools
import json
import re
import struct

import numpy as np
import pytest
import torch

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.interop.huggingface import convert_to_hf
from lmforge.models import build_model, get_preset, save_pretrained
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.viz import (
    attention_page,
    page_data,
    plot_attention,
    plot_loss_curves,
    plot_positional_encoding,
    plot_rollout,
)
from lmforge.viz.attention import DPI, figure_size, panels
from lmforge.viz.explorer import compact_weights
from lmforge.viz.explorer_page import HEAD_COLOURS, MASKED, RAMP, SCRIPT
from lmforge.viz.views import AttentionView
from lmforge.workflows.inspect import attention_maps, attention_rollout

CORPUS = ["Juventus lost from Ajax because they were too strong", "Juventus lost from Ajax because they were too weak",
          "the king spoke to the queen", "a man and a woman walked home"] * 3
TEXT = "Juventus lost from Ajax because they were too strong"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


def make_model(root, preset, tokenizer, **extra):
    torch.manual_seed(0)
    config = get_preset(preset, vocab_size=tokenizer.vocab_size, max_positions=64, **extra)
    return save_pretrained(build_model(config).eval(), root / preset, tokenizer)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """{encoder, decoder, seq2seq, gpt2-hf}: tiny random models saved as model directories."""
    root = tmp_path_factory.mktemp("models")
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=150, min_frequency=1)
    bb = ByteLevelBPETokenizer.train(CORPUS, vocab_size=300, min_frequency=1)
    out = {"encoder": make_model(root, "bert-tiny", wp), "decoder": make_model(root, "gpt-tiny", bb),
           "seq2seq": make_model(root, "seq2seq-tiny", wp, bos_id=wp.cls_id, eos_id=wp.sep_id, pad_id=wp.pad_id)}
    out["gpt2-hf"] = convert_to_hf(out["decoder"], root / "gpt2-hf")
    return out


def png_size(path):
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def model_attentions(model, ids):
    with torch.no_grad():
        return torch.cat(model(torch.tensor([ids]), output_attentions=True).attentions).numpy()  # (L, H, T, T)


@pytest.mark.parametrize("kind", ["encoder", "decoder", "gpt2-hf"])
def test_attention_maps_are_the_models_weights(dirs, kind):
    model, tok = lmforge.load(dirs[kind])
    maps = attention_maps(model, tok, TEXT)
    view = maps.view()
    ids = tok.encode(TEXT).ids
    assert view.weights.shape == (2, 4, len(ids), len(ids))
    np.testing.assert_allclose(view.weights, model_attentions(model, ids), atol=1e-6)
    np.testing.assert_allclose(view.weights.sum(-1), 1.0, atol=1e-5)
    if kind != "encoder":  # causal: nothing above the diagonal
        assert view.causal and np.triu(view.weights[0, 0], 1).max() == 0


def test_seq2seq_has_three_views(dirs):
    model, tok = lmforge.load(dirs["seq2seq"])
    maps = attention_maps(model, tok, "the king spoke", target="to the queen")
    src, tgt = len(tok.encode("the king spoke")), 1 + len(tok.encode("to the queen", add_special_tokens=False))
    assert list(maps.views) == ["encoder", "decoder", "cross"]
    assert maps.views["encoder"].weights.shape == (2, 4, src, src)
    assert maps.views["decoder"].weights.shape == (2, 4, tgt, tgt)
    assert maps.views["cross"].weights.shape == (2, 4, tgt, src)
    assert maps.views["cross"].keys == maps.views["encoder"].queries
    generated = attention_maps(model, tok, "the king spoke", max_new_tokens=3)  # no target: greedy output
    assert 1 <= generated.views["decoder"].weights.shape[2] <= 4


@pytest.mark.parametrize("layer,head", [(1, 2), (1, None), (None, 3), (None, None)])
def test_png_has_the_size_figure_size_says(tmp_path, dirs, layer, head):
    model, tok = lmforge.load(dirs["encoder"])
    view = attention_maps(model, tok, TEXT).view()
    path = plot_attention(view, tmp_path / "a.png", layer=layer, head=head)
    chosen, rows, cols = panels(view, layer, head)
    assert len(chosen) == {(1, 2): 1, (1, None): 4, (None, 3): 2, (None, None): 8}[(layer, head)]
    w, h = figure_size(rows, cols, len(view.queries), layer is None and head is None)
    assert png_size(path) == (round(w * DPI), round(h * DPI))


def test_png_index_errors_name_the_option(dirs, tmp_path):
    model, tok = lmforge.load(dirs["encoder"])
    view = attention_maps(model, tok, TEXT).view()
    with pytest.raises(LmforgeError, match=r"--layer: 5 is out of range"):
        plot_attention(view, tmp_path / "x.png", layer=5)
    with pytest.raises(LmforgeError, match=r"--head: 9"):
        plot_attention(view, tmp_path / "x.png", layer=0, head=9)


EXTERNAL = [r"<script[^>]*\bsrc\s*=", r"<link\b", r"@import", r"url\(", r"https?:", r"//fonts\.", r"<iframe", r"<img"]


def test_html_is_self_contained_and_holds_the_models_weights(dirs, tmp_path):
    model, tok = lmforge.load(dirs["encoder"])
    out = tmp_path / "page.html"
    assert main(["attention", "--model", str(dirs["encoder"]), "--text", TEXT, "--out", str(out)]) == 0
    page = out.read_text()
    for pattern in EXTERNAL:
        assert not re.search(pattern, page, re.I), pattern
    data = page_data(page)
    (view,) = data["views"]
    ids = tok.encode(TEXT).ids
    assert view["queries"] == tok.convert_ids_to_tokens(ids) and view["name"] == "encoder"
    weights = np.array(view["weights"])  # (L, H, T, T) at 4 decimals: what the page shows on hover
    np.testing.assert_allclose(weights, model_attentions(model, ids), atol=5e-5 + 1e-7)
    assert len(page) < 60_000


def test_html_of_seq2seq_and_decoder(dirs, tmp_path):
    model, tok = lmforge.load(dirs["seq2seq"])
    out = tmp_path / "s2s.html"
    assert main(["attention", "--model", str(dirs["seq2seq"]), "--text", "the king spoke", "--target", "the queen",
                 "--out", str(out)]) == 0
    data = page_data(out.read_text())
    maps = attention_maps(model, tok, "the king spoke", target="the queen")
    assert [v["name"] for v in data["views"]] == ["encoder", "decoder", "cross"]
    for v in data["views"]:
        np.testing.assert_allclose(np.array(v["weights"]), maps.views[v["name"]].weights, atol=5e-5 + 1e-7)
    assert data["target"] == "the queen"
    out = tmp_path / "gpt.html"
    assert main(["attention", "--model", str(dirs["gpt2-hf"]), "--text", TEXT, "--out", str(out)]) == 0
    (view,) = page_data(out.read_text())["views"]
    assert view["causal"] and view["weights"][0][0][0][1:] == [0] * (len(view["keys"]) - 1)


def test_page_start_options_are_checked(dirs):
    model, tok = lmforge.load(dirs["seq2seq"])
    maps = attention_maps(model, tok, "the king spoke", target="the queen")
    assert page_data(attention_page(maps, view="cross", layer=-1, head=2))["start"] == {"view": 2, "layer": 1,
                                                                                       "head": 2}
    with pytest.raises(LmforgeError, match="--head: 4 is out of range"):
        attention_page(maps, head=4)
    with pytest.raises(LmforgeError, match="--view: 'self'"):
        attention_page(maps, view="self")


def test_text_cannot_break_out_of_the_page(dirs, tmp_path):
    text = "</script><script>alert(1)</script> & <!-- king"
    out = tmp_path / "evil.html"
    assert main(["attention", "--model", str(dirs["encoder"]), "--text", text, "--out", str(out)]) == 0
    page = out.read_text()
    assert page.count("<script") == 2 and page.count("</script>") == 2 and "<!--" not in page
    assert page_data(page)["text"] == text


def test_rollout_by_hand():
    # Layer 1: token 1 reads token 0 only; layer 2: token 0 reads token 1 only. One head each.
    a1 = np.array([[1.0, 0.0], [1.0, 0.0]])
    a2 = np.array([[0.0, 1.0], [0.0, 1.0]])
    r1 = np.array([[1.0, 0.0], [0.5, 0.5]])  # (a1 + I) / rowsum
    r2 = np.array([[0.5, 0.5], [0.0, 1.0]])
    np.testing.assert_allclose(attention_rollout(np.stack([a1[None], a2[None]])), r2 @ r1)
    np.testing.assert_allclose(r2 @ r1, [[0.75, 0.25], [0.5, 0.5]])
    # Heads are averaged first: two heads (a1, a2) in one layer = ((a1 + a2) / 2 + I) normalised.
    two_heads = attention_rollout(np.stack([a1, a2])[None])
    np.testing.assert_allclose(two_heads, [[0.75, 0.25], [0.25, 0.75]])
    np.testing.assert_allclose(attention_rollout(np.stack([a1[None]]), residual=False), a1)
    with pytest.raises(LmforgeError, match="rollout needs self-attention"):
        attention_rollout(np.ones((1, 1, 2, 3)))


def test_rollout_png_and_cli(dirs, tmp_path, capsys):
    out = tmp_path / "roll.png"
    assert main(["attention", "--model", str(dirs["decoder"]), "--text", TEXT, "--out", str(out), "--rollout"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["out"] == str(out) and png_size(out)[0] > 300
    tokens = ["a", "b", "c"]
    path = plot_rollout(tokens, attention_rollout(np.full((2, 1, 3, 3), 1 / 3)), tmp_path / "r.png")
    assert png_size(path) == tuple(round(x * DPI) for x in figure_size(1, 1, 3, False))


def test_cli_reads_texts_from_stdin_and_reports_errors(dirs, tmp_path, monkeypatch, capsys):
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("the king spoke\n\nthe queen spoke\n"))
    out = tmp_path / "a.png"
    assert main(["attention", "--model", str(dirs["encoder"]), "--out", str(out), "--layer", "0"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["out"] for r in lines] == [str(tmp_path / "a-1.png"), str(tmp_path / "a-2.png")]
    assert all((tmp_path / f"a-{n}.png").exists() for n in (1, 2))
    assert main(["attention", "--model", str(dirs["encoder"]), "--text", "x", "--out", str(tmp_path / "a.jpg")]) == 2
    assert "--out" in capsys.readouterr().err
    assert main(["attention", "--model", str(dirs["encoder"]), "--text", "x", "--out", str(out), "--layer", "7"]) == 2
    assert "--layer: 7 is out of range" in capsys.readouterr().err
    assert main(["attention", "--model", str(tmp_path / "nope"), "--text", "x", "--out", str(out)]) == 2


def test_positional_encoding_plot(tmp_path):
    path = plot_positional_encoding(tmp_path / "pe.png", n_positions=50, d_model=32)
    assert png_size(path) == (1200, 368)
    with pytest.raises(LmforgeError, match="d_model"):
        plot_positional_encoding(tmp_path / "pe.png", d_model=1)


def test_loss_curves_overlay_several_runs(tmp_path):
    for name, scale in (("run-a", 1.0), ("run-b", 0.5)):
        run = tmp_path / name
        run.mkdir()
        events = [{"event": "train", "step": s, "loss": scale * 5 / s} for s in range(1, 21)]
        events += [{"event": "eval", "step": 10, "eval_loss": scale}, {"event": "train", "step": 21, "loss": "nan"}]
        (run / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + '{"cut sh')
    path = plot_loss_curves([tmp_path / "run-a", tmp_path / "run-b" / "log.jsonl"], tmp_path / "loss.png",
                            smoothing=0.6)
    assert png_size(path) == (700, 420)
    with pytest.raises(LmforgeError, match=r"no log\.jsonl"):
        plot_loss_curves([tmp_path / "missing"], tmp_path / "x.png")


def test_attention_view_label():
    view = AttentionView("cross", ["a"], ["b"], np.ones((1, 1, 1, 1)))
    assert "cross" in view.label


def test_weights_are_written_at_four_decimals():
    w = np.array([[0.12345678, 0.0, 1.0, 0.25, 0.99996, 3e-9]])
    assert compact_weights(w) == "[[0.1235,0,1,0.25,1,0]]"
    assert json.loads(compact_weights(np.arange(24).reshape(2, 3, 4) / 7)) == np.round(np.arange(24) / 7, 4).reshape(
        2, 3, 4).tolist()


def _luminance(hex_colour):
    c = np.array([int(hex_colour[k:k + 2], 16) for k in (1, 3, 5)]) / 255
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(lin @ [0.2126, 0.7152, 0.0722])


def _contrast(a, b):
    la, lb = sorted([_luminance(a), _luminance(b)], reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_explorer_colours_are_readable():
    """The ramp runs light to dark (a darker cell is always a larger weight) with a wide range; the masked grey
    is not on it; every head's colour stands 3:1 against the white page (WCAG for graphics)."""
    lum = [_luminance(c) for c in RAMP]
    assert all(a > b for a, b in itertools.pairwise(lum))
    assert _contrast(RAMP[0], RAMP[-1]) >= 15 and _contrast(RAMP[-1], "#ffffff") >= 15
    assert MASKED not in RAMP
    assert len(set(HEAD_COLOURS)) == len(HEAD_COLOURS) >= 12
    assert min(_contrast(c, "#ffffff") for c in HEAD_COLOURS) >= 3
    assert "__" not in SCRIPT  # every placeholder filled


def test_page_has_the_three_tabs_and_the_controls(dirs):
    model, tok = lmforge.load(dirs["seq2seq"])
    page = attention_page(attention_maps(model, tok, "the king spoke", target="the queen"))
    for element in ('id="tab-model"', 'id="tab-head"', 'id="tab-matrix"', 'id="model-grid"', 'id="lines"',
                    'id="heatmap"', 'id="view"', 'id="layer"', 'id="head"', 'id="scale"', 'id="tip"'):
        assert page.count(element) == 1, element
