"""Translation: sacrebleu scores, a small Seq2Seq trained from the CLI recipe on a synthetic language pair,
then `lmforge translate` (plain, --eval with BLEU/chrF, --align) on sentences it never saw."""

import json
import random

import pytest
import sacrebleu
import torch

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.workflows.pretrain import pretrain
from lmforge.workflows.translate import alignment, corpus_scores, source_ids, translate

WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def spelled(rng: random.Random) -> tuple[str, str]:
    """'three one four' -> '4 1 3': read the digits and write them in reverse order."""
    digits = [rng.randrange(10) for _ in range(rng.randint(2, 5))]
    return " ".join(WORDS[d] for d in digits), " ".join(str(d) for d in reversed(digits))


def test_corpus_scores_are_sacrebleus():
    hyps = ["the cat sat on the mat", "a dog barks", "hello there"]
    refs = ["the cat sat on a mat", "the dog barks loudly", "hello there"]
    scores = corpus_scores(hyps, refs)
    assert scores["bleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)
    assert corpus_scores(refs, refs)["bleu"] == 100.0 and corpus_scores(refs, refs)["chrf"] == 100.0
    with pytest.raises(LmforgeError, match="2 translations for 3 references"):
        corpus_scores(hyps[:2], refs)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, single_thread):
    """A 2+2-layer Seq2Seq trained for 300 steps on 3,000 synthetic pairs: about 10 s on one thread (a model
    this small loses to thread synchronisation on two cores: 60 s with two threads on a busy machine)."""
    root = tmp_path_factory.mktemp("translate")
    rng = random.Random(0)
    train = root / "train.tsv"
    train.write_text("\n".join("\t".join(spelled(rng)) for _ in range(3000)) + "\n")
    test = root / "test.tsv"
    test.write_text("\n".join("\t".join(spelled(rng)) for _ in range(40)) + "\n")
    recipe = {"tokenizer": {"kind": "byte-bpe", "vocab_size": 300},
              "data": {"objective": "seq2seq", "files": [str(train)], "seq_len": 16, "eval_batches": 2,
                       "workers": 1},
              "model": {"d_model": 64, "n_heads": 4, "d_ff": 128, "n_encoder_layers": 2, "n_decoder_layers": 2,
                        "max_positions": 64, "dropout": 0.0, "label_smoothing": 0.1},
              "train": {"max_steps": 300, "batch_size": 32, "lr": 3e-3, "warmup_steps": 30, "eval_every": 0,
                        "save_every": 300, "log_every": 50, "progress": False, "plot": False}}
    torch.manual_seed(0)
    _, model_dir = pretrain(recipe, root / "run")
    return model_dir, test


def test_trained_model_translates_unseen_sentences(trained):
    model_dir, test = trained
    model, tokenizer = lmforge.load(model_dir)
    pairs = [line.split("\t") for line in test.read_text().splitlines()]
    beam = translate(model, tokenizer, [s for s, _ in pairs], beams=4)
    greedy = translate(model, tokenizer, [s for s, _ in pairs], beams=1, batch_size=7)
    scores = corpus_scores(beam, [t for _, t in pairs])
    assert scores["bleu"] > 80, (scores, beam[:5])
    assert sum(g == t for g, (_, t) in zip(greedy, pairs, strict=True)) >= 30
    # one sentence alone translates as it does inside a padded, length-sorted batch
    assert translate(model, tokenizer, [pairs[3][0]], beams=4) == [beam[3]]


def test_cli_translates_scores_and_aligns(trained, tmp_path, capsys):
    model_dir, test = trained
    assert main(["translate", "--model", str(model_dir), "four two"]) == 0
    line = json.loads(capsys.readouterr().out)
    assert line == {"source": "four two", "translation": "2 4"}
    hyps = tmp_path / "hyps.txt"
    assert main(["translate", "--model", str(model_dir), "--eval", str(test), "--out", str(hyps),
                 "--beams", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["sentences"] == 40 and report["bleu"] > 80 and report["chrf"] > 80
    assert len(hyps.read_text().splitlines()) == 40 and report["samples"][0]["translation"]
    png = tmp_path / "align.png"
    assert main(["translate", "--model", str(model_dir), "--align", str(png), "one two three"]) == 0
    assert png.stat().st_size > 2000 and json.loads(capsys.readouterr().out)["translation"] == "3 2 1"


def test_alignment_rows_are_distributions(trained):
    model_dir, _ = trained
    model, tokenizer = lmforge.load(model_dir)
    a = alignment(model, tokenizer, "seven eight nine", "9 8 7")
    assert a.weights.shape == (len(source_ids(tokenizer, "9 8 7")) + 1, len(source_ids(tokenizer, "seven eight nine")))
    assert abs(a.weights.sum(1) - 1).max() < 1e-5 and len(a.target_tokens) == a.weights.shape[0]


def test_translate_rejects_a_decoder_only_model(tmp_path, capsys):
    from lmforge.models import Decoder, get_preset, save_pretrained

    save_pretrained(Decoder(get_preset("gpt-tiny")), tmp_path / "gpt")
    assert main(["translate", "--model", str(tmp_path / "gpt"), "hello"]) == 2
    assert "a Decoder model is not an encoder-decoder" in capsys.readouterr().err
