"""Self-training (``lmforge finetune --unlabeled``): the pseudo-label rule, the rounds in finetune.json for every
strategy, determinism for a seed, and one-line errors for bad unlabeled files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lmforge.cli import main
from lmforge.data import sources
from lmforge.errors import LmforgeError
from lmforge.models import EncoderForPreTraining, get_preset, save_pretrained
from lmforge.tokenizers import KINDS
from lmforge.workflows import self_training
from lmforge.workflows.finetune import FinetuneArgs, finetune
from lmforge.workflows.self_training import read_unlabeled, select_pseudo_labels

ANIMALS = ["the cat sat on the mat", "a dog ran in the park", "the bird sang at dawn", "a horse ate the hay",
           "the fish swam in the pond", "a cow stood in the field"]
WEATHER = ["the sun is hot today", "it will rain all night", "the wind blew hard", "snow fell on the hills",
           "the fog lifted at noon", "a storm came from the sea"]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    """A bert-tiny encoder, 4 labeled sentences a class (x3), the other 4 (x3) as an unlabeled pool with true labels."""
    root = tmp_path_factory.mktemp("st")
    tok = KINDS["wordpiece"].train(ANIMALS + WEATHER, 150, 1)
    torch.manual_seed(0)
    save_pretrained(EncoderForPreTraining(get_preset("bert-tiny", vocab_size=tok.vocab_size)), root / "base", tok)
    labeled = [("animal", t) for t in ANIMALS[:4]] + [("weather", t) for t in WEATHER[:4]]
    pool = [("animal", t) for t in ANIMALS[4:]] + [("weather", t) for t in WEATHER[4:]]
    (root / "train.csv").write_text("label,text\n" + "\n".join(f"{a},{b}" for a, b in labeled * 3) + "\n")
    (root / "dev.csv").write_text("label,text\n" + "\n".join(f"{a},{b}" for a, b in labeled + pool) + "\n")
    (root / "pool.csv").write_text("label,text\n" + "\n".join(f"{a},{b}" for a, b in pool * 3) + "\n")
    (root / "pool.txt").write_text("\n".join(b for _, b in pool * 3) + "\n")
    return root


def args(task: Path, out: Path, **kw) -> FinetuneArgs:
    settings = {"model": str(task / "base"), "task": "seq-cls", "train": str(task / "train.csv"),
                "eval": str(task / "dev.csv"), "out": str(out), "lr": 3e-3, "max_steps": 6, "batch_size": 8,
                "progress": False, "unlabeled": str(task / "pool.csv"), "confidence": 0.5,
                "self_train_rounds": 2, **kw}
    return FinetuneArgs(**settings)


def test_the_rule_keeps_confident_rows_by_class_quota_under_the_cap():
    probs = torch.tensor([[0.95, 0.05], [0.90, 0.10], [0.85, 0.15], [0.60, 0.40],  # class 0, all >= 0.5
                          [0.30, 0.70], [0.45, 0.55], [0.52, 0.48], [0.20, 0.80]])
    # 4 labeled (3 of class 0, 1 of class 1), ratio 1: cap 4, quotas ceil(4 * 3/4) = 3 and ceil(4 * 1/4) = 1
    assert select_pseudo_labels(probs, [3, 1], 0.5, 1.0) == [(0, 0), (1, 0), (2, 0), (7, 1)]
    # a threshold above every row of class 1 but the best: only rows whose top probability reaches it
    chosen = select_pseudo_labels(probs, [3, 1], 0.8, 2.0)
    assert chosen == [(0, 0), (1, 0), (2, 0), (7, 1)] and all(probs[i].max() >= 0.8 for i, _ in chosen)
    assert select_pseudo_labels(probs, [3, 1], 0.99, 2.0) == []
    # the cap wins over the rounded-up quotas: ratio 0.5 of 4 labels -> 2 rows, the most confident ones
    assert select_pseudo_labels(probs, [3, 1], 0.5, 0.5) == [(0, 0), (1, 0)]
    # ties go to the earlier row
    assert select_pseudo_labels(torch.full((4, 2), 0.5), [1, 1], 0.5, 1.0) == [(0, 0)]


@pytest.mark.parametrize("strategy, extra", [("full", {}), ("frozen", {"mix": True}), ("lora", {}),
                                             ("adapter", {})])
def test_rounds_are_reported_for_every_strategy(task, tmp_path, monkeypatch, strategy, extra, capsys):
    seen = []

    def spy(probs, counts, confidence, ratio):
        chosen = select_pseudo_labels(probs, counts, confidence, ratio)
        seen.append((probs, chosen))
        return chosen

    monkeypatch.setattr(self_training, "select_pseudo_labels", spy)
    report = finetune(args(task, tmp_path / strategy, strategy=strategy, **extra))
    st = report["self_training"]
    assert [r["round"] for r in st["rounds"]] == [0, 1, 2] and len(seen) == 2
    assert st["max_pseudo_labels"] == 24 and st["unlabeled_texts"] == 12
    for (probs, chosen), row in zip(seen, st["rounds"][1:], strict=True):
        assert all(probs[i].max() >= 0.5 and probs[i].argmax() == c for i, c in chosen)  # only above C
        assert row["pseudo_labels"] == len(chosen) == sum(row["pseudo_per_class"].values()) <= 12
        assert row["train_examples"] == 24 + len(chosen)
        truth = read_unlabeled(task / "pool.csv", ["animal", "weather"])  # the pool's true labels, by hand
        right = sum(truth[i].label == ["animal", "weather"][c] for i, c in chosen)
        assert row["pseudo_accuracy"] == (pytest.approx(right / len(chosen)) if chosen else None)
    assert report["eval"]["accuracy"] == st["rounds"][-1]["eval"]["accuracy"]
    from lmforge.cli import main  # the saved last round, scored again from disk: the same accuracy
    assert main(["evaluate", "--model", str(tmp_path / strategy), "--data", str(task / "dev.csv")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["accuracy"] == pytest.approx(
        report["eval"]["accuracy"])
    saved = json.loads((tmp_path / strategy / "finetune.json").read_text())
    assert saved["self_training"] == st and (tmp_path / strategy / "confusion.png").is_file()


def test_self_training_is_deterministic_for_a_seed(task, tmp_path):
    first = finetune(args(task, tmp_path / "a", seed=3))["self_training"]["rounds"]
    second = finetune(args(task, tmp_path / "b", seed=3))["self_training"]["rounds"]
    keys = ("pseudo_labels", "pseudo_per_class", "pseudo_accuracy", "train_examples", "eval")
    assert [{k: r[k] for k in keys} for r in first] == [{k: r[k] for k in keys} for r in second]
    assert sum(r["pseudo_labels"] for r in first) > 0  # the test exercised pseudo-labels, not an empty pool


def test_cli_flags_and_a_plain_text_pool(task, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["finetune", "--model", str(task / "base"), "--task", "seq-cls", "--train", str(task / "train.csv"),
                 "--out", str(out), "--max-steps", "3", "--no-progress", "--unlabeled", str(task / "pool.txt"),
                 "--self-train-rounds", "1", "--confidence", "0.5", "--pseudo-ratio", "0.25"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rounds = summary["self_training"]["rounds"]
    assert len(rounds) == 2 and rounds[1]["pseudo_labels"] <= 6 and rounds[1]["pseudo_accuracy"] is None


def test_a_recipe_reaches_the_self_training_fields(task, tmp_path, capsys):
    recipe = tmp_path / "st.yaml"
    recipe.write_text(f"finetune: {{task: seq-cls, max_steps: 2, unlabeled: {task / 'pool.csv'}, "
                      "self_train_rounds: 2, confidence: 0.5}\n")
    assert main(["finetune", "--config", str(recipe), "finetune.pseudo_ratio=0.25", "--model", str(task / "base"),
                 "--train", str(task / "train.csv"), "--out", str(tmp_path / "o"), "--no-progress"]) == 0
    st = json.loads(capsys.readouterr().out)["self_training"]
    assert len(st["rounds"]) == 3 and st["pseudo_ratio"] == 0.25 and st["max_pseudo_labels"] == 6


def test_bad_unlabeled_files_are_one_line_naming_the_file(task, tmp_path, capsys):
    names = ["animal", "weather"]
    cases = {"empty.txt": ("\n\n", r"empty.txt: no texts \(the file is empty\)"),
             "partial.csv": ("label,text\nanimal,a cat\n,a dog\n", r"partial.csv:3: no label, but other rows"),
             "unknown.csv": ("label,text\nplant,a rose\n", r"unknown.csv:2: label 'plant' is not a training label")}
    for name, (text, message) in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(LmforgeError, match=message):
            read_unlabeled(tmp_path / name, names)
    with pytest.raises(LmforgeError, match=r"--unlabeled: .*missing.txt: no such file"):
        read_unlabeled(tmp_path / "missing.txt", names)
    common = ["finetune", "--model", str(task / "base"), "--train", str(task / "train.csv"), "--out",
              str(tmp_path / "o"), "--max-steps", "1", "--no-progress"]
    assert main([*common, "--task", "seq-cls", "--unlabeled", str(tmp_path / "unknown.csv")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown.csv:2: label 'plant'" in err and not (tmp_path / "o" / "run").exists()
    assert main([*common, "--task", "token-cls", "--unlabeled", str(task / "pool.txt")]) == 2
    assert "--unlabeled: self-training supports --task seq-cls only" in capsys.readouterr().err


@pytest.mark.skipif(not (sources.WORDNET_DIR / "data.noun").is_file(),
                    reason="WordNet is absent: install the Debian package wordnet-base (scripts/system-deps.sh)")
def test_wordnet_glosses_carry_the_45_supersenses():
    glosses = sources.wordnet_glosses()
    assert len(glosses) == 117659 and len({label for _, label in glosses}) == 45
    by_text = dict(glosses)
    assert by_text["an entity that has physical existence"] == "noun.Tops"
    assert sum(label == "verb.weather" for _, label in glosses) == 81


@pytest.mark.parametrize(("confidence", "none"), [(0.5, False), (1.0, True)])
def test_each_round_says_how_many_pseudo_labels_it_kept(task, tmp_path, capsys, confidence, none):
    """One line per round on standard error, with the count per class; a round that keeps none says so."""
    assert main(["finetune", "--model", str(task / "base"), "--task", "seq-cls", "--train", str(task / "train.csv"),
                 "--out", str(tmp_path / "o"), "--max-steps", "3", "--no-progress", "--unlabeled",
                 str(task / "pool.txt"), "--self-train-rounds", "2", "--confidence", str(confidence)]) == 0
    captured = capsys.readouterr()
    rounds = json.loads(captured.out)["self_training"]["rounds"]
    lines = [line for line in captured.err.splitlines() if "self-training round" in line]
    assert [f"round {r['round']}: kept {r['pseudo_labels']} of" in line
            for r, line in zip(rounds[1:], lines, strict=True)] == [True, True]
    assert all(("labeled data alone" in line) == none for line in lines)
