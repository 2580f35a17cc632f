"""No file of the user's is lost to ``--out`` / ``--overwrite`` (issue 39, items 7 and 8): a run claims only the
files it wrote (``lmforge.outputs``).

Every command that writes is pointed at a folder holding a user's files (thesis.txt, notes.md, train.jsonl,
data/keep.txt): it is refused in one line naming them, before any work (no model built, the folder unchanged
to the byte and the modification time, no lock or record left), with ``--overwrite`` too. A single-file output
that exists is refused unless ``--overwrite``. The record ``lmforge-output.json`` lists exactly the files its run
wrote (never a file that was there, or that a user put there during the run), and ``--overwrite`` removes only
those: never a path outside the folder, never through a link.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.cli.main import main
from lmforge.outputs import RECORD_FORMAT, RECORD_NAME
from serve_helpers import chat_model
from test_reliability import (  # noqa: F401  (fixtures)
    assert_identical,
    corpus,
    encoder_dir,
    finetune_args,
    labeled,
    lmforge_cli,
    recipe_file,
    s2s_dir,
    uninterrupted,
    weights,
)

USER_FILES = {"thesis.txt": "chapter 1: on the care of other people's files\n", "notes.md": "# notes\n",
              "train.jsonl": '{"text": "my own training data"}\n', "data/keep.txt": "a folder of mine\n"}


def plant(folder: Path) -> Path:
    """A user's folder: four files, one of them in a subfolder."""
    for name, text in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every file and folder under ``folder``: its bytes (None for a folder) and modification time."""
    return {p.relative_to(folder).as_posix(): (None if p.is_dir() else p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def built(monkeypatch) -> list[str]:
    """The torch modules built while the test runs (a model loaded or made): a refusal builds none."""
    names: list[str] = []
    original = torch.nn.Module.__init__

    def spy(self, *args, **kwargs):
        names.append(type(self).__name__)
        original(self, *args, **kwargs)

    monkeypatch.setattr(torch.nn.Module, "__init__", spy)
    return names


def refused(argv: list[str], folder: Path, capsys, built: list[str], *named: str) -> str:
    """Run ``argv``: one line of error naming ``named``, ``folder`` unchanged, no model built."""
    before = snapshot(folder)
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert all(name in err for name in named), err
    assert snapshot(folder) == before, "the refused command changed the folder"
    assert built == [], f"a model was built before the refusal: {built[:3]}"
    return err


def finetune(encoder: Path, labeled: Path, out: Path, strategy: str, *extra: str) -> list[str]:  # noqa: F811
    """test_reliability's finetune line, 2 steps."""
    return [*finetune_args(encoder, labeled, out, strategy), "--max-steps", "2", *extra]


def written(folder: Path) -> set[str]:
    """The files under ``folder``, but the record and the run locks: what the record must list."""
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")
            if p.is_file() and p.name != ".lock" and p != folder / RECORD_NAME}


def record(folder: Path) -> dict:
    return json.loads((folder / RECORD_NAME).read_text())


# -- the inputs: tiny models the other tests build too -----------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory) -> Path:
    return chat_model(tmp_path_factory.mktemp("chat") / "model")


@pytest.fixture(scope="module")
def chat_jsonl(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("chat-data") / "chat.jsonl"
    rows = [{"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
            for q, a in [("hello there", "fine thanks"), ("the cat sat?", "on the mat")] * 4]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory, encoder_dir, labeled, chat_dir) -> dict[str, Path]:  # noqa: F811
    """Outputs written by the commands themselves: a GGUF file, a Hugging Face folder, a LoRA fine-tune."""
    root = tmp_path_factory.mktemp("made")
    argvs = {"gguf": ["convert", "--to-gguf", str(chat_dir), "--out", str(root / "chat.gguf"), "--gguf-type", "f32"],
             "hf": ["convert", "--to-hf", str(encoder_dir), "--out", str(root / "hf")],
             "lora": finetune(encoder_dir, labeled, root / "lora", "lora")}
    for name, argv in argvs.items():
        assert main([*argv, "--quiet"]) == 0, name
    return {"gguf": root / "chat.gguf", "hf": root / "hf", "lora": root / "lora"}


def folder_commands(i: dict[str, Path]) -> dict[str, list[str]]:
    """Every command that writes a folder, without its --out."""
    ft = [*finetune_args(i["encoder"], i["labeled"], Path("unused"))]
    ft = ft[:ft.index("--out")] + ft[ft.index("--out") + 2:]
    seq = [a for a in ft if a != "full" and a != "--strategy"]
    return {
        "tokenizer train": ["tokenizer", "train", "--kind", "bpe", "--vocab-size", "60", "--min-frequency", "1",
                            "--workers", "1", str(i["corpus"])],
        "data prepare": ["data", "prepare", "--tokenizer", str(i["encoder"]), "--workers", "1", str(i["corpus"])],
        "pretrain": ["pretrain", "--config", str(i["recipe"])],
        **{f"finetune seq-cls {s}": [*seq, "--strategy", s] for s in ("full", "frozen", "lora", "adapter")},
        "finetune token-cls": [a if a != "seq-cls" else "token-cls" for a in ft],
        "finetune self-training": [*ft, "--unlabeled", str(i["corpus"])],
        "finetune chat": ["finetune", "--task", "chat", "--model", str(i["chat"]), "--train", str(i["chat_jsonl"]),
                          "--strategy", "lora", "--max-steps", "2", "--batch-size", "2", "--max-len", "64",
                          "--no-progress"],
        "convert --from-hf": ["convert", "--from-hf", str(i["hf"])],
        "convert --to-hf": ["convert", "--to-hf", str(i["encoder"])],
        "convert --from-gguf": ["convert", "--from-gguf", str(i["gguf"])],
        "convert --to-peft": ["convert", "--to-peft", str(i["lora"])],
        "convert --merge": ["convert", "--merge", str(i["lora"])],
        "demo": ["demo", "--quick"],
    }


NO_OVERWRITE_FLAG = {"pretrain", "demo"}  # a run folder resumes; nothing there is ever replaced


@pytest.fixture(scope="module")
def inputs(corpus, encoder_dir, labeled, recipe_file, chat_dir, chat_jsonl, made) -> dict[str, Path]:  # noqa: F811
    return {"corpus": corpus, "encoder": encoder_dir, "labeled": labeled, "recipe": recipe_file, "chat": chat_dir,
            "chat_jsonl": chat_jsonl, **made}


COMMANDS = sorted(folder_commands({k: Path(k) for k in ("encoder", "labeled", "corpus", "recipe", "chat",
                                                             "chat_jsonl", "hf", "gguf", "lora")}))


# -- 1. a folder holding a user's files: refused, with or without --overwrite, before any work ------------------------
@pytest.mark.parametrize(("command", "overwrite"), [(c, False) for c in COMMANDS] +
                         [(c, True) for c in COMMANDS if c not in NO_OVERWRITE_FLAG])
def test_a_folder_holding_user_files_is_refused_before_any_work(tmp_path, capsys, built, inputs, command, overwrite):
    mine = plant(tmp_path / "mine")
    argv = [*folder_commands(inputs)[command], "--out", str(mine), *(["--overwrite"] * overwrite)]
    err = refused(argv, tmp_path, capsys, built, str(mine), "holds 4 files or folders that lmforge did not write",
                  "data/", "notes.md", "thesis.txt", "train.jsonl")
    assert "choose an empty or new --out" in err


def test_the_issues_finetune_into_the_current_folder_keeps_every_file(tmp_path, capsys, built, monkeypatch,
                                                                       encoder_dir, labeled):  # noqa: F811
    """The probe of issue 39: ``finetune --out .`` in a folder of one's own, then the --overwrite the refusal used
    to suggest, which deleted thesis.txt, notes.md and train.jsonl."""
    monkeypatch.chdir(plant(tmp_path))
    argv = list(finetune_args(encoder_dir, labeled, Path(".")))
    refused(argv, tmp_path, capsys, built, ".: holds 4 files or folders", "thesis.txt")
    refused([*argv, "--overwrite"], tmp_path, capsys, built, "--overwrite never removes them")


# -- 2. the record lists what the run wrote; --overwrite removes that and nothing else --------------------------------
RECORDED = ["tokenizer train", "data prepare", "pretrain", "finetune seq-cls lora", "finetune chat",
            "convert --from-hf", "convert --to-hf", "convert --from-gguf", "convert --to-peft", "convert --merge"]


@pytest.mark.parametrize("command", RECORDED)
def test_the_record_lists_exactly_the_files_the_run_wrote(tmp_path, capsys, inputs, command):
    out = tmp_path / "out"
    assert main([*folder_commands(inputs)[command], "--out", str(out), "--quiet"]) == 0, capsys.readouterr().err
    kept = record(out)
    assert kept["complete"] is True and kept["files"] == sorted(written(out)) and kept["files"]
    if command == "pretrain":  # a rerun on the same --out resumes its run
        capsys.readouterr()
        assert main([*folder_commands(inputs)[command], "--out", str(out), "--quiet", "--max-steps", "12"]) == 0
        assert json.loads(capsys.readouterr().out)["resumed_from"] == 10
        assert record(out)["files"] == sorted(written(out))


def test_a_file_put_in_the_folder_during_the_run_is_never_claimed_nor_removed(tmp_path, capsys, monkeypatch,
                                                                               encoder_dir, labeled):  # noqa: F811
    import lmforge.workflows.finetune as workflow

    out = tmp_path / "ft"
    save = workflow.save_finetuned

    def user_saves_notes_meanwhile(*args, **kwargs):
        (out / "notes.md").write_text("written by the user while the run trained\n")
        return save(*args, **kwargs)

    monkeypatch.setattr(workflow, "save_finetuned", user_saves_notes_meanwhile)
    assert main(finetune(encoder_dir, labeled, out, "lora")) == 0
    assert "notes.md" not in record(out)["files"] and "adapter.safetensors" in record(out)["files"]
    before = snapshot(out)
    assert main(finetune(encoder_dir, labeled, out, "full", "--overwrite")) == 2
    assert "(notes.md); --overwrite never removes them" in capsys.readouterr().err
    assert snapshot(out) == before  # the earlier output stays whole too


def test_overwrite_removes_the_recorded_files_and_only_them(tmp_path, capsys, encoder_dir, labeled):  # noqa: F811
    out = tmp_path / "ft"
    assert main(finetune(encoder_dir, labeled, out, "lora", "--keep-checkpoints")) == 0
    assert any(f.startswith("run/checkpoints/step-") for f in record(out)["files"])
    assert main(finetune(encoder_dir, labeled, out, "full", "--overwrite")) == 0, capsys.readouterr().err
    names = written(out)
    assert "model.safetensors" in names and "adapter.safetensors" not in names  # never side by side
    assert not any(n.startswith("run/checkpoints/step-") for n in names)  # the old run's checkpoints went with it
    assert record(out)["identity"]["strategy"] == "full" and record(out)["files"] == sorted(names)


# -- 3. folders of earlier versions: the same command adopts lmforge's files there, never a user's; none is deleted ---
def as_earlier_lmforge(folder: Path, listed: list[str] | None = None) -> Path:
    """Rewrite the record as lmforge wrote it before records had a format: kind, identity, and every file at the
    top of the folder, a user's too (``listed``: tokenizer train named only tokenizer.json and tokenizer.vocab)."""
    kept = record(folder)
    top = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name not in (RECORD_NAME, ".lock"))
    (folder / RECORD_NAME).write_text(json.dumps({"kind": kept["kind"], "identity": kept["identity"],
                                                  "files": top if listed is None else listed}))
    return folder


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory, recipe_file) -> Path:  # noqa: F811
    """A pretraining run of an earlier lmforge stopped at step 4: its files and no record (it kept none)."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    stopped = lmforge_cli("pretrain", "--config", str(recipe_file), "--out", str(out), "--threads", "1", "--quiet",
                          LMFORGE_TEST_SIGNAL_AT_STEP="4:TERM")
    assert stopped.returncode == 143, stopped.stderr
    (out / RECORD_NAME).unlink()
    return out


@pytest.mark.parametrize("command", [c for c in RECORDED if c != "pretrain"])
def test_an_earlier_lmforges_output_is_adopted_by_the_same_command(tmp_path, capsys, inputs, command):
    out = tmp_path / "out"
    argv = [*folder_commands(inputs)[command], "--out", str(out), "--quiet"]
    assert main(argv) == 0, capsys.readouterr().err
    as_earlier_lmforge(out, ["tokenizer.json", "tokenizer.vocab"] if command == "tokenizer train" else None)
    assert main(argv) == 0, capsys.readouterr().err
    assert record(out)["format"] == RECORD_FORMAT and record(out)["files"] == sorted(written(out))


def test_an_earlier_record_never_makes_a_users_file_lmforges(tmp_path, capsys, built, encoder_dir, labeled):  # noqa: F811
    """The earlier record listed thesis.txt and notes.md (they were in the folder): the rerun is refused naming
    them; moved away, the run resumes, and its record never lists them: put back, they are the user's again."""
    out = tmp_path / "ft"
    argv = [a for a in finetune(encoder_dir, labeled, out, "lora", "--keep-checkpoints") if a != "--quiet"]
    assert main(argv) == 0
    for name in ("thesis.txt", "notes.md"):
        (out / name).write_text(USER_FILES[name])
    assert "thesis.txt" in record(as_earlier_lmforge(out))["files"]
    built.clear()
    refused(argv, tmp_path, capsys, built, "holds 2 files that lmforge did not write (notes.md, thesis.txt) (its "
            f"{RECORD_NAME} is an older lmforge's")
    for name in ("thesis.txt", "notes.md"):
        os.replace(out / name, tmp_path / name)
    assert main(argv) == 0 and "resuming" in capsys.readouterr().err
    assert record(out)["files"] == sorted(written(out)) and "adapter.safetensors" in record(out)["files"]
    os.replace(tmp_path / "thesis.txt", out / "thesis.txt")
    built.clear()
    refused(finetune(encoder_dir, labeled, out, "full", "--overwrite"), tmp_path, capsys, built,
            "(thesis.txt); --overwrite never removes them")


def test_an_earlier_lmforges_pretraining_run_resumes_bit_identical(
        tmp_path, earlier_run, recipe_file, uninterrupted):  # noqa: F811
    out = Path(shutil.copytree(earlier_run, tmp_path / "run"))
    resumed = lmforge_cli("pretrain", "--config", str(recipe_file), "--out", str(out), "--threads", "1", "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed_from"] == 4
    assert_identical(weights(out / "model"), uninterrupted)
    assert record(out)["complete"] is True and record(out)["files"] == sorted(written(out))


def test_a_users_file_in_an_earlier_pretraining_run_is_named_and_refused(
        tmp_path, capsys, built, earlier_run, recipe_file):  # noqa: F811
    out = Path(shutil.copytree(earlier_run, tmp_path / "run"))
    (out / "thesis.txt").write_text(USER_FILES["thesis.txt"])
    (out / "checkpoints" / "notes.md").write_text(USER_FILES["notes.md"])
    refused(["pretrain", "--config", str(recipe_file), "--out", str(out)], tmp_path, capsys, built,
            "holds 2 files that lmforge did not write (checkpoints/notes.md, thesis.txt); --overwrite never")


def test_an_earlier_output_of_other_settings_is_refused_even_with_overwrite(
        tmp_path, capsys, built, corpus, encoder_dir, labeled):  # noqa: F811
    """Nothing is removed on the word of an earlier record (it listed user files) nor of names alone: another
    tokenizer, or another strategy than an earlier fine-tune stopped mid-run (run/ only, no record)."""
    tok = ["tokenizer", "train", "--kind", "bpe", "--min-frequency", "1", "--workers", "1", "--quiet", str(corpus)]
    assert main([*tok, "--vocab-size", "60", "--out", str(tmp_path / "tok")]) == 0
    as_earlier_lmforge(tmp_path / "tok", ["tokenizer.json", "tokenizer.vocab"])
    cut = tmp_path / "ft"
    assert main(finetune(encoder_dir, labeled, cut, "lora", "--keep-checkpoints")) == 0
    for path in cut.iterdir():
        if path.name != "run":
            path.unlink()
    built.clear()
    refused([*tok, "--vocab-size", "70", "--out", str(tmp_path / "tok"), "--overwrite"], tmp_path, capsys, built,
            "holds another tokenizer (vocab_size: 60, not 70), written by an earlier lmforge")
    refused(finetune(encoder_dir, labeled, cut, "full", "--overwrite"), tmp_path, capsys, built,
            "holds another finetune (strategy: lora, not full), written by an earlier lmforge", "not even with")
    assert main(finetune(encoder_dir, labeled, cut, "lora", "--keep-checkpoints")) == 0  # its own: adopted
    assert record(cut)["identity"]["strategy"] == "lora" and record(cut)["files"] == sorted(written(cut))


def test_a_record_never_reaches_outside_its_folder(tmp_path, capsys, corpus):  # noqa: F811
    """Entries with '..', absolute paths, or reached through a link: nothing outside the folder is removed."""
    outside = tmp_path / "outside"
    victims = [outside / "victim.txt", outside / "absolute.txt", outside / "linked" / "x.txt"]
    for v in victims:
        v.parent.mkdir(parents=True, exist_ok=True)
        v.write_text("not lmforge's\n")
    tok = ["tokenizer", "train", "--kind", "bpe", "--min-frequency", "1", "--workers", "1", "--quiet", str(corpus)]
    out = tmp_path / "tok"
    assert main([*tok, "--vocab-size", "60", "--out", str(out)]) == 0
    forged = record(out)
    forged["files"] += ["../outside/victim.txt", str(victims[1]), "linked/x.txt"]
    (out / RECORD_NAME).write_text(json.dumps(forged))
    assert main([*tok, "--vocab-size", "70", "--out", str(out), "--overwrite"]) == 0, capsys.readouterr().err
    assert all(v.is_file() for v in victims)
    assert record(out)["files"] == sorted(written(out)) == ["checksums.json", "tokenizer.json", "tokenizer.vocab"]
    (out / "linked").symlink_to(victims[2].parent)  # the record's "linked/x.txt" now leads outside
    (out / RECORD_NAME).write_text(json.dumps({**record(out), "files": [*record(out)["files"], "linked/x.txt"]}))
    assert main([*tok, "--vocab-size", "80", "--out", str(out), "--overwrite"]) == 2
    assert "holds 1 file that lmforge did not write (linked)" in capsys.readouterr().err
    (out / "linked").unlink()
    (out / "tokenizer.vocab").unlink()
    (out / "tokenizer.vocab").symlink_to(victims[0])  # a recorded name that is now a link: not lmforge's
    assert main([*tok, "--vocab-size", "80", "--out", str(out), "--overwrite"]) == 2
    assert "(tokenizer.vocab)" in capsys.readouterr().err
    assert all(v.read_text() == "not lmforge's\n" for v in victims)


# -- 4. single-file outputs: an existing file is replaced only with --overwrite ------------------------------------
def file_commands(i: dict[str, Path]) -> dict[str, tuple[list[str], str]]:
    """(argv without --out's value, the file name) of every command that writes one file."""
    return {
        "convert --to-gguf": (["convert", "--to-gguf", str(i["chat"]), "--gguf-type", "f32", "--out"], "model.gguf"),
        "embed --out": (["embed", "--model", str(i["encoder"]), "the king rode out", "--out"], "vectors.npy"),
        "attention --out html": (["attention", "--model", str(i["encoder"]), "--text", "the king", "--out"],
                                 "page.html"),
        "attention --out png, two texts": (["attention", "--model", str(i["encoder"]), "--out"], "map-2.png"),
        "translate --out": (["translate", "--model", str(i["s2s"]), "--eval", str(i["pairs"]), "--out"],
                            "translations.txt"),
        "translate --align": (["translate", "--model", str(i["s2s"]), "the king", "--align"], "align.png"),
        "evaluate --png": (["evaluate", "--model", str(i["lora"]), "--data", str(i["labeled"]), "--png"],
                           "confusion.png"),
    }


@pytest.mark.parametrize("command", sorted(file_commands({k: Path(k) for k in ("chat", "encoder", "s2s", "pairs",
                                                                                "lora", "labeled")})))
def test_an_existing_file_is_replaced_only_with_overwrite(
        tmp_path, capsys, monkeypatch, built, inputs, s2s_dir, command):  # noqa: F811
    def feed() -> None:  # two texts from standard input, one a line: map-1.png and map-2.png
        monkeypatch.setattr("sys.stdin", io.StringIO("the king\nthe queen\n"))

    if command.startswith("translate"):
        pytest.importorskip("sacrebleu", reason="translate --eval scores with sacrebleu")
    argv, name = file_commands({**inputs, "s2s": s2s_dir, "pairs": s2s_dir.parent / "pairs.tsv"})[command]
    mine = plant(tmp_path / "mine")
    target = mine / name
    target.write_bytes(b"a file of the user's, e.g. a downloaded GGUF\n")
    path = str(target).replace("map-2.png", "map.png")  # two texts write map-1.png and map-2.png
    feed()
    refused([*argv, path], tmp_path, capsys, built, name, "already exists", "--overwrite")
    feed()
    assert main([*argv, path, "--overwrite", "--quiet"]) == 0, capsys.readouterr().err
    assert target.read_bytes() != b"a file of the user's, e.g. a downloaded GGUF\n"
    assert all((mine / n).read_text() == text for n, text in USER_FILES.items())
    if name.endswith(".npy"):
        assert np.load(target).shape[0] == 1


def test_a_single_file_output_is_never_a_folder_nor_an_input(tmp_path, capsys, built, s2s_dir):  # noqa: F811
    pytest.importorskip("sacrebleu", reason="translate --eval scores with sacrebleu")
    pairs = s2s_dir.parent / "pairs.tsv"
    before = pairs.read_bytes()
    argv = ["translate", "--model", str(s2s_dir), "--eval", str(pairs), "--overwrite", "--out", str(pairs)]
    refused(argv, tmp_path, capsys, built, "is an input of this command")
    assert pairs.read_bytes() == before
    plant(tmp_path / "mine")
    refused(["embed", "--model", "x", "a", "--out", str(tmp_path / "mine" / "data"), "--overwrite"], tmp_path,
            capsys, built, "must end in .npy or .jsonl")
    os.mkdir(tmp_path / "mine" / "v.npy")
    refused(["embed", "--model", "x", "a", "--out", str(tmp_path / "mine" / "v.npy"), "--overwrite"], tmp_path,
            capsys, built, "is a directory")
