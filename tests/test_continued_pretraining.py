"""Continued pretraining (``model.init_from``): the checkpoint's weights and tokenizer really are the start,
a missing MLM head is made fresh and tied, the loss falls, the run resumes and fine-tunes; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.tokenizers import KINDS, load_tokenizer
from lmforge.workflows.finetune import FinetuneArgs, finetune
from lmforge.workflows.pretrain import model_from_checkpoint, pretrain

transformers = pytest.importorskip("transformers", reason="transformers (a dev dependency) builds the HF checkpoints")

WORDS = ["the cat sat on the mat", "a dog ran in the park", "birds sing in the trees at dawn",
         "the sun is hot today and the sea is calm", "we ate bread and cheese by the river ."]
TRAIN = {"max_steps": 6, "batch_size": 8, "lr": 1e-3, "warmup_steps": 1, "eval_every": 3, "save_every": 3,
         "log_every": 1, "progress": False}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Ten lines a sentence, shuffled: enough windows for a few batches of masked LM."""
    root = tmp_path_factory.mktemp("corpus")
    rng = torch.Generator().manual_seed(0)
    lines = [WORDS[int(i)] for i in torch.randint(len(WORDS), (200,), generator=rng)]
    (root / "text.txt").write_text("\n".join(lines) + "\n")
    return root / "text.txt"


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
    """A tiny Hugging Face ``BertModel`` (no MLM head, like all-MiniLM-L6-v2) with its vocab.txt."""
    tok = KINDS["wordpiece"].train(WORDS * 5, 120, 1)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
    folder = tmp_path_factory.mktemp("hf-bert")
    transformers.BertModel(config).eval().save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(tok.id_to_token) + "\n")
    return folder


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A tiny Hugging Face ``GPT2LMHeadModel`` with a byte-level BPE tokenizer of the same size."""
    tok = KINDS["byte-bpe"].train(WORDS * 5, 300, 1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=tok.vocab_size, n_positions=64)
    folder = tmp_path_factory.mktemp("hf-gpt2")
    transformers.GPT2LMHeadModel(config).eval().save_pretrained(folder)
    tok.save(folder)
    return folder


def recipe(init_from, files, objective="mlm", **train):
    return {"model": {"init_from": str(init_from)},
            "data": {"objective": objective, "files": [str(f) for f in files], "seq_len": 24, "eval_batches": 2,
                     "workers": 1},
            "train": {**TRAIN, **train}}


def test_bert_without_mlm_head_starts_from_its_weights_with_a_fresh_tied_head(bert_dir, capsys):
    """Step 0 reproduces the checkpoint's hidden states; the new head is tied with bias 0, and the log says so."""
    model = model_from_checkpoint({"init_from": str(bert_dir)}, "mlm").eval()
    assert "no MLM head; starting a fresh one" in capsys.readouterr().err
    hf = transformers.BertModel.from_pretrained(bert_dir).eval()
    ids = torch.tensor([[2, 7, 9, 11, 3], [2, 5, 6, 3, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask).last_hidden_state
        theirs = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (ours - theirs)[mask.bool()].abs().max() < 1e-5
    assert model.mlm.decoder.weight is model.encoder.embeddings.tok_emb.weight
    assert torch.count_nonzero(model.mlm.decoder.bias) == 0


def test_gpt2_continues_with_its_tied_lm_head(gpt2_dir, corpus, tmp_path):
    model = model_from_checkpoint({"init_from": str(gpt2_dir)}, "clm").eval()
    assert model.lm_head.proj.weight is model.tok_emb.weight
    hf = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
    ids = torch.tensor([[5, 9, 17, 40]])
    with torch.no_grad():
        assert (model(ids).logits - hf(ids).logits).abs().max() < 1e-4
    result, model_dir = pretrain(recipe(gpt2_dir, [corpus], "clm"), tmp_path / "run")
    assert result.step == 6 and (model_dir / "model.safetensors").is_file()
    assert load_tokenizer(tmp_path / "run" / "tokenizer").vocab_size == load_tokenizer(gpt2_dir).vocab_size


def test_masked_lm_loss_falls_and_the_model_fine_tunes(bert_dir, corpus, tmp_path):
    _, model_dir = pretrain(recipe(bert_dir, [corpus], max_steps=30, eval_every=0, save_every=30, lr=5e-3),
                                 tmp_path / "run")
    losses = [e["loss"] for e in map(json.loads, (tmp_path / "run" / "log.jsonl").read_text().splitlines())
              if "loss" in e]
    assert len(losses) == 30 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    # the checkpoint's tokenizer is used as it is: same vocabulary, token for token
    assert load_tokenizer(model_dir).id_to_token == load_tokenizer(bert_dir).id_to_token
    rows = [("animal", "the cat sat on the mat"), ("animal", "a dog ran in the park"),
            ("weather", "the sun is hot today"), ("weather", "the sea is calm")]
    (tmp_path / "train.csv").write_text("label,text\n" + "\n".join(f"{a},{b}" for a, b in rows) + "\n")
    report = finetune(FinetuneArgs(model=str(model_dir), task="seq-cls", train=str(tmp_path / "train.csv"),
                                   eval=str(tmp_path / "train.csv"), out=str(tmp_path / "ft"), max_steps=2,
                                   progress=False))
    assert report["eval"]["n"] == 4


def test_cli_resumes_a_continued_pretraining_run(bert_dir, corpus, tmp_path, capsys):
    config = tmp_path / "dapt.yaml"
    config.write_text(yaml.safe_dump({**recipe(None, [corpus]), "model": {"init_from": None}}))
    out = tmp_path / "run"
    argv = ["pretrain", "--config", str(config), "--out", str(out), f"model.init_from={bert_dir}"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*argv, "train.max_steps=9"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["step"] == 6 and second["step"] == 9 and second["resumed_from"] == 6


def test_the_shipped_recipe_is_masked_lm_from_a_checkpoint():
    recipe = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "bert-dapt.yaml").read_text())
    assert recipe["data"]["objective"] == "mlm" and recipe["data"]["mlm_probability"] == 0.15
    assert recipe["data"]["seq_len"] == 128 and "init_from" in recipe["model"] and "tokenizer" not in recipe
    assert 1e-5 <= recipe["train"]["lr"] <= 1e-4 and recipe["train"]["warmup_steps"] > 0


def test_bad_init_from_is_one_line_naming_the_key(bert_dir, gpt2_dir, corpus, tmp_path, capsys):
    cases = [
        (recipe(gpt2_dir, [corpus], "mlm"), r"holds a gpt2 model, not a BERT-style encoder; data.objective mlm"),
        (recipe(bert_dir, [corpus], "clm"), r"holds a bert model, not a decoder \(GPT\); data.objective clm"),
        (recipe(tmp_path / "nowhere", [corpus]), r"model.init_from: .*nowhere: no such directory"),
        (recipe(bert_dir, [corpus], "seq2seq"), r"model.init_from: continued pretraining supports"),
        ({**recipe(bert_dir, [corpus]), "tokenizer": {"kind": "wordpiece"}}, r"tokenizer: not used with"),
    ]
    conflicting = recipe(bert_dir, [corpus])
    conflicting["model"]["d_model"] = 64
    cases.append((conflicting, r"model.d_model: 64 conflicts with the checkpoint .* \(d_model 32\)"))
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((bert_dir / name).read_bytes())
    cases.append((recipe(bare, [corpus]), r"model.init_from: .*bare has no tokenizer"))
    for i, (r, message) in enumerate(cases):
        with pytest.raises(LmforgeError, match=message):
            pretrain(r, tmp_path / f"run{i}")
    capsys.readouterr()
    config = tmp_path / "r.yaml"
    config.write_text(yaml.safe_dump(recipe(gpt2_dir, [corpus], "mlm")))
    assert main(["pretrain", "--config", str(config), "--out", str(tmp_path / "cli")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"model.init_from: {gpt2_dir} holds a gpt2 model" in err
