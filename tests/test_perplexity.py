"""`lmforge evaluate` on a language model: perplexity and bits per character, against the model's own loss."""

from __future__ import annotations

import json
import math

import pytest
import torch

from lmforge.cli import main
from lmforge.models import Decoder, get_preset, save_pretrained
from lmforge.tokenizers import KINDS
from lmforge.workflows.perplexity import perplexity

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    tok = KINDS["byte-bpe"].train([TEXT] * 3, 280, 1)
    torch.manual_seed(0)
    model = Decoder(get_preset("gpt-tiny", vocab_size=tok.vocab_size, max_positions=32)).eval()
    folder = tmp_path_factory.mktemp("lm") / "gpt"
    save_pretrained(model, folder, tok)
    return model, tok, folder


def test_a_text_inside_one_window_scores_as_the_models_loss(lm):
    model, tok, _ = lm
    text = "To be, or not to be"
    ids = torch.tensor([tok.encode(text, add_special_tokens=False).ids])
    assert ids.shape[1] < 32
    loss = float(model(ids, labels=ids).loss)  # mean NLL of tokens 2..N given the ones before
    report = perplexity(model, tok, text)
    assert report["scored_tokens"] == ids.shape[1] - 1
    assert report["nll_per_token"] == pytest.approx(loss, rel=1e-5)
    assert report["perplexity"] == pytest.approx(math.exp(loss), rel=1e-5)
    total = loss * (ids.shape[1] - 1)
    assert report["bits_per_character"] == pytest.approx(total / math.log(2) / len(text), rel=1e-5)


def test_long_texts_slide_and_score_every_token_once(lm):
    model, tok, _ = lm
    text = TEXT * 6
    report = perplexity(model, tok, text, stride=8)
    assert report["tokens"] > 3 * 32 and report["scored_tokens"] == report["tokens"] - 1
    # a token scored with more context is predicted at least roughly as well: the overlapped evaluation is
    # no worse than cutting the text into independent windows
    blocks = perplexity(model, tok, text, stride=32)
    assert blocks["scored_tokens"] < report["scored_tokens"]


def test_evaluate_command_reports_perplexity(lm, tmp_path, capsys):
    _, _, folder = lm
    data = tmp_path / "t.txt"
    data.write_text(TEXT * 2, encoding="utf-8")
    assert main(["evaluate", "--model", str(folder), "--data", str(data), "--stride", "16"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stride"] == 16 and out["bits_per_byte"] == pytest.approx(out["bits_per_character"])
    assert out["perplexity"] == pytest.approx(math.exp(out["nll_per_token"]))
