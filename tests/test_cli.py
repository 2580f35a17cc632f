"""The command line's one style: every command has --quiet, every command that runs a model spells --device
and --threads the same, results go to standard output and progress to standard error."""

from __future__ import annotations

import argparse
import json

import pytest

from lmforge.cli import build_parser, main

MODEL_COMMANDS = {"pretrain", "finetune", "evaluate", "predict", "generate", "translate", "attention", "embed"}


def leaf_parsers() -> dict[str, argparse.ArgumentParser]:
    """'tokenizer train' -> its parser, for every command that runs something."""
    out = {}

    def walk(parser: argparse.ArgumentParser, prefix: str) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            out[prefix.strip()] = parser
        for action in subs:
            for name, child in action.choices.items():
                walk(child, f"{prefix} {name}")

    walk(build_parser(), "")
    return out


LEAVES = leaf_parsers()


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_every_command_group_is_reached():
    assert {name.split()[0] for name in LEAVES} == {"demo", "tokenizer", "data", "pretrain", "convert", "generate",
                                                     "translate", "chat", "serve", "finetune", "evaluate", "predict",
                                                     "attention", "embed"}


@pytest.mark.parametrize("name", sorted(LEAVES))
def test_the_same_options_everywhere(name):
    have = options(LEAVES[name])
    assert "--quiet" in have
    if name in MODEL_COMMANDS:
        assert {"--device", "--threads"} <= have, f"{name} lacks --device/--threads"
        device = next(a for a in LEAVES[name]._actions if "--device" in a.option_strings)
        assert device.metavar == "DEV"


def test_quiet_keeps_results_and_drops_progress(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\n" * 30, encoding="utf-8")
    argv = ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "40", "--min-frequency", "1", "--workers", "1"]
    assert main([*argv, "--out", str(tmp_path / "a"), str(corpus)]) == 0
    loud = capsys.readouterr()
    assert main([*argv, "--out", str(tmp_path / "b"), str(corpus), "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert loud.err and quiet.err == ""
    assert json.loads(quiet.out) == {**json.loads(loud.out), "path": str(tmp_path / "b" / "tokenizer.json")}
    assert main(["tokenizer", "encode", "--tokenizer", str(tmp_path / "nowhere"), "x", "--quiet"]) == 2
    assert capsys.readouterr().err.startswith("lmforge: error: ")  # errors still reach standard error


def test_training_flags_are_shortcuts_for_the_recipe(tmp_path, capsys):
    import yaml

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"data": {"files": ["x.txt"]}, "train": {"max_steps": 3}}))
    assert main(["pretrain", "--config", str(recipe), "--precision", "bf16", "--compile", "--device", "cpu",
                 "--print-config", "train.lr=0.01"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert (printed["train"]["precision"], printed["train"]["compile"], printed["train"]["device"]) == ("bf16", True,
                                                                                                         "cpu")
    assert printed["train"]["lr"] == 0.01 and printed["train"]["max_steps"] == 3
    assert printed["train"]["tensorboard"] is False  # nobody asked: no TensorBoard, and no warning about it
    assert main(["finetune", "--model", "m", "--task", "seq-cls", "--train", "t.csv", "--precision", "fp16",
                 "--compile", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)["finetune"]
    assert (printed["precision"], printed["compile"], printed["model"]) == ("fp16", True, "m")


def test_packaged_recipes_work_from_any_directory(tmp_path, capsys, monkeypatch):
    import yaml

    monkeypatch.chdir(tmp_path)  # no configs/ here
    assert main(["pretrain", "--config", "gpt-mini", "--print-config"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["data"]["objective"] == "clm"
    assert main(["pretrain", "--config", "gpt-mni", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "gpt-mni: no such recipe file" in err and "gpt-mini" in err
