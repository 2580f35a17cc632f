"""Fine-tuning end to end on tiny models: the four strategies through the CLI, saving and reloading,
evaluate / predict, Hugging Face starting points, and the one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.models import EncoderForPreTraining, get_preset, save_pretrained
from lmforge.tokenizers import KINDS
from lmforge.workflows.finetune import FinetuneArgs, finetune, load_finetuned, predict_lines

SURE = ["the cat sat on the mat", "the sun is hot today", "a dog ran in the park", "we ate the bread"]
UNSURE = ["maybe the cat sat", "it could possibly rain", "perhaps a dog ran", "we might eat bread"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A bert-tiny encoder (with its pre-training heads) and a WordPiece tokenizer, as lmforge saves them."""
    root = tmp_path_factory.mktemp("ft")
    tok = KINDS["wordpiece"].train(SURE + UNSURE, 150, 1)
    torch.manual_seed(0)
    save_pretrained(EncoderForPreTraining(get_preset("bert-tiny", vocab_size=tok.vocab_size)), root / "base", tok)
    rows = [("certain", t) for t in SURE] + [("uncertain", t) for t in UNSURE]
    (root / "train.csv").write_text("label,text\n" + "\n".join(f"{lab},{t}" for lab, t in rows * 4) + "\n")
    (root / "dev.csv").write_text("label,text\n" + "\n".join(f"{lab},{t}" for lab, t in rows) + "\n")
    tagged = [" ".join(f"{w}/{'DT' if w in ('the', 'a') else 'NN'}" for w in t.split()) for t in SURE + UNSURE]
    (root / "tags.txt").write_text("\n".join(tagged * 3) + "\n")
    return root


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("strategy, extra", [("full", []), ("frozen", []), ("frozen", ["--mix"]),
                                             ("lora", []), ("adapter", [])])
def test_every_strategy_trains_evaluates_and_predicts_from_the_cli(base, tmp_path, capsys, strategy, extra):
    out = tmp_path / strategy
    code, stdout, _ = cli(capsys, "finetune", "--model", str(base / "base"), "--task", "seq-cls", "--train",
                          str(base / "train.csv"), "--eval", str(base / "dev.csv"), "--strategy", strategy,
                          "--out", str(out), "--max-steps", "3", "--batch-size", "8", "--no-progress", *extra)
    assert code == 0
    summary = json.loads(stdout)
    assert summary["trainable_params"] > 0 and summary["checkpoint_bytes"] > 0 and summary["peak_rss_bytes"] > 0
    assert summary["eval"]["n"] == 8
    delta = strategy in ("lora", "adapter") or extra
    assert (out / ("adapter.safetensors" if delta else "model.safetensors")).is_file()
    assert (out / "confusion.png").is_file() and not (out / "run" / "checkpoints").exists()
    if strategy != "full":
        assert summary["trainable_ratio"] < 0.5
    code, stdout, _ = cli(capsys, "evaluate", "--model", str(out), "--data", str(base / "dev.csv"))
    assert code == 0 and json.loads(stdout)["accuracy"] == summary["eval"]["accuracy"]
    code, stdout, _ = cli(capsys, "predict", "--model", str(out), "maybe it rains", "the cat sat")
    lines = [json.loads(x) for x in stdout.splitlines()]
    assert len(lines) == 2 and lines[0]["label"] in ("certain", "uncertain")
    assert sum(lines[0]["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    # the reported accuracy is the share of dev rows whose predicted label is the gold one
    rows = [line.split(",", 1) for line in (base / "dev.csv").read_text().splitlines()[1:]]
    code, stdout, _ = cli(capsys, "predict", "--model", str(out), *[text for _, text in rows])
    predicted = [json.loads(x)["label"] for x in stdout.splitlines()]
    assert summary["eval"]["accuracy"] == pytest.approx(
        sum(p == gold for p, (gold, _) in zip(predicted, rows, strict=True)) / len(rows))


def test_full_fine_tuning_learns_a_separable_task(base, tmp_path):
    report = finetune(FinetuneArgs(model=str(base / "base"), task="seq-cls", train=str(base / "train.csv"),
                                   eval=str(base / "dev.csv"), out=str(tmp_path / "o"), lr=3e-3, max_steps=40,
                                   batch_size=8, progress=False))
    assert report["eval"]["accuracy"] == 1.0


def test_lora_directory_reloads_to_the_same_predictions_merged(base, tmp_path):
    args = FinetuneArgs(model=str(base / "base"), task="seq-cls", train=str(base / "train.csv"), strategy="lora",
                        out=str(tmp_path / "lora"), lr=1e-2, max_steps=5, batch_size=8, progress=False)
    report = finetune(args)
    assert report["checkpoint_bytes"] == (tmp_path / "lora" / "adapter.safetensors").stat().st_size
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["labels"] == ["certain", "uncertain"] and config["strategy"] == "lora"
    model, tok, info = load_finetuned(tmp_path / "lora")
    assert info["labels"] == ["certain", "uncertain"]
    import lmforge

    again_model, again_tok = lmforge.load(tmp_path / "lora")  # lmforge.load rebuilds adapter directories too
    assert type(again_model) is type(model) and again_tok.vocab_size == tok.vocab_size
    merged = predict_lines(model, tok, info, SURE + UNSURE)
    from lmforge.nn.lora import unmerge_lora

    unmerge_lora(model)
    unmerged = predict_lines(model, tok, info, SURE + UNSURE)
    for a, b in zip(merged, unmerged, strict=True):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5)
    finetune(FinetuneArgs(**{**vars(args), "out": str(tmp_path / "merged"), "merge": True}))
    full, tok2, info2 = load_finetuned(tmp_path / "merged")  # a plain model directory: lmforge.load reads it
    again = predict_lines(full, tok2, info2, SURE + UNSURE)
    for a, b in zip(merged, again, strict=True):
        assert a["probabilities"] == pytest.approx(b["probabilities"], abs=1e-5)


def test_token_classification_labels_every_word(base, tmp_path, capsys):
    out = tmp_path / "pos"
    code, stdout, _ = cli(capsys, "finetune", "--model", str(base / "base"), "--task", "token-cls", "--train",
                          str(base / "tags.txt"), "--eval", str(base / "tags.txt"), "--strategy", "lora",
                          "--out", str(out), "--max-steps", "3", "--no-progress")
    assert code == 0
    summary = json.loads(stdout)
    assert summary["eval"]["n"] == sum(len(t.split()) for t in SURE + UNSURE) * 3
    assert "token_accuracy" in summary["eval"]
    code, stdout, _ = cli(capsys, "predict", "--model", str(out), "the cat sat", "")
    first, blank = (json.loads(x) for x in stdout.splitlines())
    assert first["words"] == ["the", "cat", "sat"] and len(first["labels"]) == 3
    assert set(first["labels"]) <= {"DT", "NN"} and blank["words"] == []


def test_hugging_face_bert_directory_as_starting_model(base, tmp_path):
    transformers = pytest.importorskip("transformers")
    tok = KINDS["wordpiece"].train(SURE + UNSURE, 150, 1)
    hf = tmp_path / "hf"
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(hf)
    (hf / "vocab.txt").write_text("\n".join(tok.id_to_token) + "\n")
    report = finetune(FinetuneArgs(model=str(hf), task="seq-cls", train=str(base / "train.csv"), strategy="lora",
                                   eval=str(base / "dev.csv"), out=str(tmp_path / "o"), max_steps=2, progress=False))
    assert report["eval"]["n"] == 8
    model, _, info = load_finetuned(tmp_path / "o")
    assert info["task"] == "seq-cls" and model.encoder.config.d_model == 32


def test_bad_input_gives_one_line_errors(base, tmp_path, capsys):
    (tmp_path / "dev.csv").write_text("label,text\ncertain,the cat\nunheard,the dog\n")
    common = ["finetune", "--model", str(base / "base"), "--task", "seq-cls", "--train", str(base / "train.csv"),
              "--out", str(tmp_path / "o"), "--max-steps", "1", "--no-progress"]
    code, _, err = cli(capsys, *common, "--eval", str(tmp_path / "dev.csv"))
    assert code == 2 and err.count("\n") == 1
    assert "dev.csv:3: label 'unheard' never seen in training" in err
    (tmp_path / "empty.csv").write_text("label,text\ncertain,\n")
    code, _, err = cli(capsys, *common, "--eval", str(tmp_path / "empty.csv"))
    assert code == 2 and "empty.csv:2: empty 'text'" in err
    other = KINDS["wordpiece"].train(["completely different words here"] * 3, 60, 1)
    other.save(tmp_path / "tok")
    with pytest.raises(LmforgeError, match=r"tokenizer has .* tokens but the model .* expects vocab_size"):
        from lmforge.interop.directories import build_task_model

        build_task_model(base / "base", "seq-cls", 2, tmp_path / "tok")
    code, _, err = cli(capsys, "predict", "--model", str(base / "base"), "hello")
    assert code == 2 and "has no classification head" in err


def test_recipe_overrides_and_flags_reach_every_field(base, tmp_path, capsys):
    """`--config` + KEY=VALUE + flags: the flags win, overrides beat the recipe, and fields no flag had
    before (weight_decay, warmup, eval_batch_size) are reachable; the run's config.yaml records them."""
    recipe = tmp_path / "ft.yaml"
    recipe.write_text(yaml.safe_dump({"finetune": {"task": "seq-cls", "strategy": "frozen", "max_steps": 4,
                                                    "batch_size": 8, "weight_decay": 0.3, "warmup": 0.5,
                                                    "eval_batch_size": 3, "lr": 1e-3}}))
    out = tmp_path / "o"
    code, stdout, err = cli(capsys, "finetune", "--config", str(recipe), "--model", str(base / "base"),
                            "--train", str(base / "train.csv"), "--eval", str(base / "dev.csv"), "--out", str(out),
                            "--no-progress", "finetune.lr=2e-3", "--strategy", "lora")
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["strategy"] == "lora" and summary["steps"] == 4 and summary["lr"] == 2e-3
    saved = yaml.safe_load((out / "run" / "config.yaml").read_text())
    assert saved["finetune"]["weight_decay"] == 0.3 and saved["finetune"]["eval_batch_size"] == 3
    assert saved["train"]["warmup_steps"] == 2 and saved["train"]["weight_decay"] == 0.3
    code, _, err = cli(capsys, "finetune", "--config", str(recipe), "finetune.warmup=lots")
    assert code == 2 and err.strip() == "lmforge: error: finetune.warmup: expected a number, got 'lots'"
    code, _, err = cli(capsys, "finetune", "--config", str(recipe), "finetune.lr_decay=1")
    assert code == 2 and "finetune.lr_decay: unknown key" in err
    code, _, err = cli(capsys, "finetune", "--config", str(recipe))
    assert code == 2
    assert err.strip() == "lmforge: error: --model: required (as a flag or as finetune.model in the recipe)"


def test_adapters_travel_with_their_base_and_refuse_another(base, tmp_path):
    """The base model is recorded as given plus its place relative to the adapter and its weights' sha256:
    moving both together still loads; a missing base names adapter_config.json; a different base is refused."""
    import shutil

    from lmforge.models import EncoderForPreTraining, get_preset, save_pretrained
    from lmforge.tokenizers import load_tokenizer

    project = tmp_path / "project"
    shutil.copytree(base / "base", project / "base")
    finetune(FinetuneArgs(model=str(project / "base"), task="seq-cls", train=str(base / "train.csv"),
                          strategy="lora", out=str(project / "lora"), max_steps=2, batch_size=8, progress=False))
    meta = json.loads((project / "lora" / "adapter_config.json").read_text())
    assert meta["base_model"] == str(project / "base") and meta["base_model_relative"] == "../base"
    expected = load_finetuned(project / "lora")[0]
    moved = tmp_path / "elsewhere"
    shutil.move(project, moved)  # the recorded absolute path is gone; the relative one still holds
    model, _, _ = load_finetuned(moved / "lora")
    x = torch.tensor([[2, 5, 6, 7, 3]])
    assert torch.equal(model(x).logits, expected(x).logits)
    shutil.rmtree(moved / "base")
    with pytest.raises(LmforgeError, match=r"lora/adapter_config.json: base_model .* not found"):
        load_finetuned(moved / "lora")
    tok = load_tokenizer(base / "base")
    torch.manual_seed(1)
    save_pretrained(EncoderForPreTraining(get_preset("bert-tiny", vocab_size=tok.vocab_size)), moved / "base", tok)
    with pytest.raises(LmforgeError, match=r"not the one this adapter was trained on"):
        load_finetuned(moved / "lora")


def test_lora_exports_to_peft_and_merged(base, tmp_path, capsys):
    """PEFT is the oracle: PeftModel.from_pretrained on the exported adapter gives lmforge's logits; --merge
    gives a plain directory that predicts the same."""
    peft = pytest.importorskip("peft", reason="peft is in the dev extra; install lmforge[dev]")
    import transformers

    finetune(FinetuneArgs(model=str(base / "base"), task="seq-cls", train=str(base / "train.csv"), strategy="lora",
                          out=str(tmp_path / "lora"), max_steps=3, batch_size=8, lr=5e-3, progress=False))
    ours, tok, info = load_finetuned(tmp_path / "lora")
    assert main(["convert", "--to-peft", str(tmp_path / "lora"), "--out", str(tmp_path / "peft")]) == 0
    assert main(["convert", "--merge", str(tmp_path / "lora"), "--out", str(tmp_path / "merged")]) == 0
    capsys.readouterr()
    hf = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "peft" / "base")
    model = peft.PeftModel.from_pretrained(hf, tmp_path / "peft").eval()
    assert hf.config.id2label == dict(enumerate(info["labels"]))
    ids = torch.tensor([tok.encode("it may rain today").ids])
    with torch.no_grad():
        without = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "peft" / "base").eval()
        assert (without(input_ids=ids).logits - ours(ids).logits).abs().max() > 1e-4  # LoRA changed something
        assert (model(input_ids=ids).logits - ours(ids).logits).abs().max() < 1e-5
        merged, _, merged_info = load_finetuned(tmp_path / "merged")
        assert (merged(ids).logits - ours(ids).logits).abs().max() < 1e-5
    assert merged_info["labels"] == info["labels"] and not (tmp_path / "merged" / "adapter_config.json").exists()


def test_evaluation_during_training_keeps_the_best_step_and_stops_early(base, tmp_path, capsys):
    """--eval-every scores the model as it trains; the saved model is the best one (its accuracy is the one
    reported for that step); --early-stopping ends the run after PATIENCE evaluations without gain."""
    out = tmp_path / "o"
    code, _, err = cli(capsys, "finetune", "--model", str(base / "base"), "--task", "seq-cls", "--train",
                       str(base / "train.csv"), "--eval", str(base / "dev.csv"), "--out", str(out),
                       "--max-steps", "40", "--batch-size", "8", "--lr", "3e-3", "--no-progress",
                       "--eval-every", "4", "--early-stopping", "2")
    assert code == 0, err
    report = json.loads((out / "finetune.json").read_text())
    evals, best = report["evals"], report["best"]
    assert [e["step"] for e in evals] == list(range(4, 4 * len(evals) + 1, 4))
    assert best["value"] == max(e["accuracy"] for e in evals)
    first_best = next(e["step"] for e in evals if e["accuracy"] == best["value"])
    assert best["step"] == first_best and report["eval"]["accuracy"] == best["value"]  # the kept weights
    if report["stopped_early_at"] is not None:  # two evaluations in a row without gain, then the stop
        assert report["stopped_early_at"] == evals[-1]["step"] == best["step"] + 8
    else:
        assert len(evals) == 10
    code, _, err = cli(capsys, "finetune", "--model", str(base / "base"), "--task", "seq-cls", "--train",
                       str(base / "train.csv"), "--out", str(out), "--eval-every", "4")
    assert code == 2 and "--eval FILE" in err
