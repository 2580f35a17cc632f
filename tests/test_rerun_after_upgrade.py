"""A folder that an earlier lmforge wrote, or that this one finished, runs again: ``make demo`` twice, or after an
upgrade, must not fail (issue 39's outputs rule: an earlier version's folder is adopted by a rerun of the same
command, and only lmforge's own files in it are adopted).

- the demo folder of the version before the outputs rule (the layout its ``demo --quick`` wrote, file for file:
  no record at its top, a finished pretraining run, a LoRA fine-tune with the old record) is adopted, and a user's
  file put in it is still named and refused;
- a finished pretraining run rerun reports its last evaluation, as logged (the demo prints its perplexity);
- a fine-tune whose recorded settings lack a setting added since (an earlier version's ``config.yaml``) resumes
  when today's value is that setting's default, and is refused when it is not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from lmforge.cli.main import main
from lmforge.errors import LmforgeError
from lmforge.outputs import RECORD_NAME, claim_output
from test_reliability import corpus, encoder_dir, finetune_args, labeled, lmforge_cli, recipe_file  # noqa: F401

# what e6af796's `lmforge demo --quick` left in its --out (find -type f), locks aside
EARLIER_FOLDERS = {
    "finetune/data": "dev.csv train.csv",
    "finetune/lora": "adapter.safetensors adapter_config.json checksums.json confusion.png finetune.json "
                     "lmforge-output.json tokenizer.json tokenizer.vocab vocab.txt",
    "finetune/lora/run": "config.yaml log.jsonl loss.png",
    "pretrain": "config.yaml log.jsonl loss.png checkpoints/latest",
    "pretrain/checkpoints/step-000150": "checksums.json config.json model.safetensors optimizer.pt trainer.json",
    "pretrain/corpus": "checksums.json manifest.json train.docs.npy train.lines.npy train.tokens valid.tokens",
    "pretrain/model": "checksums.json config.json model.safetensors tokenizer.json tokenizer.vocab",
    "pretrain/tokenizer": "checksums.json tokenizer.json tokenizer.vocab"}
EARLIER_DEMO = [f"{folder}/{name}" for folder, names in EARLIER_FOLDERS.items() for name in names.split()]


def earlier_demo(folder: Path) -> Path:
    for name in EARLIER_DEMO:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("{}" if name.endswith(RECORD_NAME) else "x")
    (folder / "finetune/lora" / RECORD_NAME).write_text(json.dumps(  # the old record: kind, identity, top files
        {"kind": "finetune", "identity": {"task": "seq-cls", "strategy": "lora"}, "files": ["adapter.safetensors"]}))
    return folder


def test_an_earlier_demo_folder_is_adopted_by_the_demo(tmp_path):
    out = earlier_demo(tmp_path / "demo")
    with claim_output(out, "demo", flag=None) as claimed:  # refused before this fix: finetune/, pretrain/ foreign
        assert claimed.files == set(EARLIER_DEMO)


def test_a_users_file_in_an_earlier_demo_folder_is_still_refused(tmp_path):
    out = earlier_demo(tmp_path / "demo")
    (out / "pretrain" / "thesis.txt").write_text("mine")
    (out / "notes.md").write_text("mine")
    with pytest.raises(LmforgeError, match=r"holds 2 files that lmforge did not write \(notes.md, pretrain/thesis"):
        claim_output(out, "demo", flag=None)


def test_a_finished_run_rerun_reports_its_last_evaluation(tmp_path, recipe_file):  # noqa: F811
    out = tmp_path / "run"
    runs = [lmforge_cli("pretrain", "--config", str(recipe_file), "--out", str(out), "--threads", "1", "--quiet")
            for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr
    first, again = (json.loads(r.stdout) for r in runs)
    assert first["eval"] and again["eval"] == first["eval"]  # the rerun had {} before: the demo's print failed
    assert again["loss"] == first["loss"] and again["resumed_from"] == 10


@pytest.mark.parametrize("dropped,extra,ok", [("activation_checkpointing", [], True),
                                               ("seed", ["--seed", "7"], False)])
def test_a_fine_tune_recorded_before_a_setting_existed_resumes_at_its_default(
        tmp_path, capsys, encoder_dir, labeled, dropped, extra, ok):  # noqa: F811
    out = tmp_path / "ft"
    argv = [*finetune_args(encoder_dir, labeled, out, "lora"), "--max-steps", "2", "--keep-checkpoints"]
    assert main(argv) == 0, capsys.readouterr().err
    saved = out / "run" / "config.yaml"
    recipe = yaml.safe_load(saved.read_text())
    del recipe["finetune"][dropped]  # as an earlier version's record, written before that setting existed
    saved.write_text(yaml.safe_dump(recipe))
    code = main([*argv, *extra])
    err = capsys.readouterr().err
    if ok:  # refused before: "finetune.activation_checkpointing is None in this run but False now"
        assert code == 0, err
    else:  # today's default (0) is what that run used: 7 is another run
        assert code == 2 and "finetune.seed is 0 in this run but 7 now" in err, err
