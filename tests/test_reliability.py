"""A run that is stopped, preempted, corrupted or rerun with other inputs loses nothing and never lies.

Each test checks one promise of docs/training.md ("What lmforge guarantees") and fails without it.
Processes that must receive a real signal, hold a lock or die run as children (``python -m lmforge.cli``
or tests/train_toy.py) with ``PYTHONPATH`` pointing at this checkout.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file

import lmforge
from lmforge.cli.main import main
from lmforge.errors import LmforgeError
from lmforge.lock import RunLock
from lmforge.manifest import MANIFEST_NAME
from lmforge.train import TrainConfig
from lmforge.train.checkpoint import checkpoints_dir, latest_checkpoint
from lmforge.train.trainer import Callback, Trainer, train
from train_toy import ToyLM, ToySource

SRC = Path(__file__).resolve().parents[1] / "src"
TOY = Path(__file__).with_name("train_toy.py")
FAULTS = Path(__file__).with_name("faults.py")
WORDS = ["the", "king", "and", "queen", "of", "a", "small", "land", "rode", "out", "at", "dawn", "to", "see", "what",
         "the", "sea", "had", "left", "on", "the", "sand", "after", "a", "long", "night", "of", "storm", "wind", "rain"]


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(SRC), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    for key in ("LMFORGE_TEST_KILL_AT_STEP", "LMFORGE_TEST_SIGNAL_AT_STEP", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    return {**env, **extra}


def lmforge_cli(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """The ``lmforge`` command in a child process, with tests/faults.py's hooks installed."""
    return subprocess.run([sys.executable, str(FAULTS), *args], env=child_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def write_corpus(path: Path, lines: int = 120, seed: int = 0) -> Path:
    rng = random.Random(seed)
    path.write_text("\n".join(" ".join(rng.choices(WORDS, k=12)) for _ in range(lines)) + "\n", encoding="utf-8")
    return path


def tiny_recipe(files: list[str], steps: int = 10) -> dict:
    return {"tokenizer": {"kind": "byte-bpe", "vocab_size": 300},
            "data": {"objective": "clm", "files": files, "seq_len": 16, "eval_batches": 1, "workers": 1},
            "model": {"preset": "gpt-tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64,
                      "max_positions": 32},
            "train": {"max_steps": steps, "batch_size": 4, "lr": 1e-3, "save_every": 100, "eval_every": 0,
                      "log_every": 1, "keep_last": 5, "progress": False, "plot": False, "tensorboard": False}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("text") / "a.txt")


@pytest.fixture(scope="module")
def recipe_file(tmp_path_factory, corpus) -> Path:
    path = tmp_path_factory.mktemp("recipe") / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe([str(corpus)], steps=10)))
    return path


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def assert_identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# -- 1. graceful stop ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, recipe_file) -> dict[str, torch.Tensor]:
    out = tmp_path_factory.mktemp("ref") / "run"
    done = lmforge_cli("pretrain", "--config", str(recipe_file), "--out", str(out), "--threads", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    return weights(out / "model")


@pytest.mark.slow
@pytest.mark.parametrize("name,code", [("TERM", 143), ("INT", 130)])
def test_a_signal_saves_the_step_and_the_rerun_ends_bit_identical(tmp_path, recipe_file, uninterrupted, name, code):
    step = random.randint(2, 8)
    out = tmp_path / "run"
    args = ("pretrain", "--config", str(recipe_file), "--out", str(out), "--threads", "1", "--quiet")
    stopped = lmforge_cli(*args, LMFORGE_TEST_SIGNAL_AT_STEP=f"{step}:{name}")
    assert stopped.returncode == code, stopped.stderr
    last = stopped.stderr.strip().splitlines()[-1]
    assert last.startswith(f"lmforge: stopped by SIG{name} after step {step}; checkpoint ") and "again" in last
    assert latest_checkpoint(out).step == step  # saved at the step it stopped, not at the last save_every
    resumed = lmforge_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["resumed_from"] == step
    assert_identical(weights(out / "model"), uninterrupted)


def test_a_second_signal_waits_for_the_save_and_a_third_quits(tmp_path):
    """While the checkpoint is written, a second SIGTERM is only reported; a third ends the process at once."""
    script = (
        "import os, signal, sys, time\n"
        "from lmforge.train.signals import GracefulStop\n"
        "from lmforge.train.distributed import detect\n"
        "import torch\n"
        "stop = GracefulStop(detect(), torch.device('cpu')); stop.install()\n"
        "os.kill(os.getpid(), signal.SIGTERM); os.kill(os.getpid(), signal.SIGTERM)\n"
        "print(stop.requested(), stop.count, flush=True)\n"
        "if sys.argv[1] == '3': os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n")
    two = subprocess.run([sys.executable, "-c", script, "2"], env=child_env(), capture_output=True, text=True)
    assert two.returncode == 0 and two.stdout.split() == [str(int(signal.SIGTERM)), "2"], two.stderr
    assert "still saving" in two.stderr
    three = subprocess.run([sys.executable, "-c", script, "3"], env=child_env(), capture_output=True, text=True)
    assert three.returncode == 143 and "quitting without saving" in three.stderr


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, corpus) -> Path:
    from lmforge.models import Encoder, get_preset, save_pretrained
    from lmforge.tokenizers import WordPieceTokenizer

    out = tmp_path_factory.mktemp("encoder") / "model"
    tok = WordPieceTokenizer.train([corpus.read_text()], vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    model = Encoder(get_preset("bert-tiny", vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, d_ff=64))
    save_pretrained(model, out, tok)
    return out


@pytest.fixture(scope="module")
def labeled(tmp_path_factory) -> Path:
    rng = random.Random(1)
    rows = ["text,label"] + [f"{' '.join(rng.choices(WORDS, k=6))},{'pos' if i % 2 else 'neg'}" for i in range(64)]
    path = tmp_path_factory.mktemp("labeled") / "train.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def finetune_args(encoder_dir: Path, labeled: Path, out: Path, strategy: str = "full") -> tuple[str, ...]:
    return ("finetune", "--model", str(encoder_dir), "--task", "seq-cls", "--train", str(labeled), "--out", str(out),
            "--strategy", strategy, "--max-steps", "8", "--batch-size", "8", "--threads", "1", "--quiet",
            "--no-progress")


@pytest.mark.slow
def test_finetune_stops_on_a_signal_and_resumes_bit_identical(tmp_path, encoder_dir, labeled):
    ref = lmforge_cli(*finetune_args(encoder_dir, labeled, tmp_path / "ref"))
    assert ref.returncode == 0, ref.stderr
    step = random.randint(2, 6)
    out = tmp_path / "cut"
    stopped = lmforge_cli(*finetune_args(encoder_dir, labeled, out), LMFORGE_TEST_SIGNAL_AT_STEP=f"{step}:TERM")
    assert stopped.returncode == 143, stopped.stderr
    assert latest_checkpoint(out / "run").step == step
    checkpoint = out / "run" / "checkpoints" / f"step-{step:06d}"  # a model directory: evaluate it as it is
    evaluated = lmforge_cli("evaluate", "--model", str(checkpoint), "--data", str(labeled), "--quiet")
    assert evaluated.returncode == 0 and "accuracy" in json.loads(evaluated.stdout), evaluated.stderr
    resumed = lmforge_cli(*finetune_args(encoder_dir, labeled, out))
    assert resumed.returncode == 0, resumed.stderr
    assert_identical(weights(out), weights(tmp_path / "ref"))


# -- 2. checksums -------------------------------------------------------------------------------------------------
def test_a_flipped_tensor_byte_is_caught_and_named(tmp_path, encoder_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in encoder_dir.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    path = model_dir / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-100:-36] = bytes(b ^ 0xFF for b in data[-100:-36])  # 64 bytes inside the last tensor
    path.write_bytes(bytes(data))
    with pytest.raises(LmforgeError, match=r"model\.safetensors: sha256 differs from checksums\.json"):
        lmforge.load(model_dir)
    lmforge.load(model_dir, verify=False)  # the bytes still parse: only the checksum knows


def test_a_file_missing_from_the_manifest_is_refused_and_so_is_a_missing_manifest(tmp_path, encoder_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in encoder_dir.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    manifest = json.loads((model_dir / MANIFEST_NAME).read_text())
    del manifest["files"]["model.safetensors"]
    (model_dir / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(LmforgeError, match=r"model\.safetensors: not listed in checksums\.json"):
        lmforge.load(model_dir)
    (model_dir / MANIFEST_NAME).unlink()  # lmforge wrote it (config.json says so): no manifest, no trust
    with pytest.raises(LmforgeError, match=r"checksums\.json is missing.*--no-verify"):
        lmforge.load(model_dir)
    model, tok = lmforge.load(model_dir, verify=False)
    assert tok is not None and type(model).__name__ == "Encoder"
    config = json.loads((model_dir / "config.json").read_text())
    del config["lmforge_version"]  # as from an older lmforge, or written by hand: loads, unverified
    (model_dir / "config.json").write_text(json.dumps(config))
    (model_dir / "tokenizer.json").unlink()  # an lmforge tokenizer.json without its manifest is refused too
    assert type(lmforge.load(model_dir)[0]).__name__ == "Encoder"


def toy_config(**kw) -> TrainConfig:
    base = {"lr": 1e-2, "max_steps": 6, "batch_size": 4, "save_every": 3, "keep_last": 0, "log_every": 1,
            "progress": False, "plot": False, "tensorboard": False}
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("damage", ["truncate-weights", "flip-optimizer", "truncate-without-manifest"])
def test_resume_falls_back_to_the_newest_checkpoint_that_verifies(tmp_path, capsys, damage):
    torch.manual_seed(0)
    train(ToyLM(), ToySource(4), toy_config(), tmp_path)
    newest = checkpoints_dir(tmp_path) / "step-000006"
    if damage == "flip-optimizer":
        data = bytearray((newest / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (newest / "optimizer.pt").write_bytes(bytes(data))
    else:
        if damage == "truncate-without-manifest":
            (newest / MANIFEST_NAME).unlink()
        size = (newest / "model.safetensors").stat().st_size
        with open(newest / "model.safetensors", "r+b") as f:
            f.truncate(size // 2)
    capsys.readouterr()
    trainer = Trainer(ToyLM(), ToySource(4), toy_config(max_steps=8), tmp_path)
    assert trainer.setup().step == 3
    assert "skipping checkpoint step-000006: " in capsys.readouterr().err


def test_a_pickle_payload_is_refused_in_one_line(tmp_path, capsys):
    from argparse import Namespace as Payload  # any object that is not a tensor: unpickling it could run code

    from lmforge.train.checkpoint import Checkpoint

    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 8, "n_layer": 1, "n_head": 2,
                                                "vocab_size": 10, "n_positions": 16}))
    torch.save({"wte.weight": torch.zeros(10, 8), "x": Payload()}, hf / "pytorch_model.bin")
    assert main(["generate", "--model", str(hf), "--prompt", "hello"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "pytorch_model.bin: refused: it holds Python objects other than tensors" in err and "weights_only" not in err
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    torch.save({"optimizer": Payload()}, ckpt / "optimizer.pt")
    with pytest.raises(LmforgeError, match=r"optimizer\.pt: refused: it holds Python objects"):
        Checkpoint(ckpt, 1, {}).optimizer()


@pytest.mark.parametrize("value,why", [("64", "expected an integer, got '64'"), (-64, "must be >= 1, got -64")])
def test_a_malformed_config_value_is_one_line_before_any_tensor(tmp_path, encoder_dir, value, why):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for f in encoder_dir.iterdir():
        (model_dir / f.name).write_bytes(f.read_bytes())
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "d_model": value}))
    with pytest.raises(LmforgeError, match=f"config.json: d_model: {why}"):
        lmforge.load(model_dir, verify=False)


# -- 3. the run's record never lies --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, corpus) -> Path:
    from lmforge.workflows.pretrain import pretrain

    out = tmp_path_factory.mktemp("finished") / "run"
    recipe = tiny_recipe([str(corpus)], steps=4)
    recipe["train"]["save_every"] = 2
    torch.manual_seed(0)
    pretrain(recipe, out)
    return out


def test_a_changed_corpus_is_refused_naming_the_key_and_the_record_stays(tmp_path, finished_run, corpus):
    from lmforge.workflows.pretrain import pretrain

    other = write_corpus(tmp_path / "b.txt", seed=5)
    before = (finished_run / "config.yaml").read_text()
    recipe = tiny_recipe([str(other)], steps=6)
    with pytest.raises(LmforgeError, match=r"data\.files is \[.*a\.txt'\] in this run but \[.*b\.txt'\] now"):
        pretrain(recipe, finished_run)
    recipe = tiny_recipe([str(corpus)], steps=4)
    recipe["tokenizer"]["vocab_size"] = 280
    with pytest.raises(LmforgeError, match=r"tokenizer\.vocab_size is 300 in this run but 280 now"):
        pretrain(recipe, finished_run)
    assert (finished_run / "config.yaml").read_text() == before


def test_config_yaml_follows_only_settings_that_produced_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    train(ToyLM(), ToySource(4), toy_config(), tmp_path)
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    # a resumed run with a new lr that fails before its first checkpoint leaves the record as it was
    with pytest.raises(LmforgeError, match="non-finite"):
        train(ToyLM(), ToySource(4, poison_step=7), toy_config(max_steps=9, lr=5e-3), tmp_path)
    assert yaml.safe_load((tmp_path / "config.yaml").read_text()) == saved
    train(ToyLM(), ToySource(4), toy_config(max_steps=9, lr=5e-3), tmp_path)  # allowed change, logged
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["lr"] == 5e-3


def test_an_empty_validation_split_is_an_error_or_an_explicit_choice(tmp_path, capsys):
    from lmforge.workflows.pretrain import pretrain

    one_line = tmp_path / "one.txt"
    one_line.write_text(" ".join(random.Random(0).choices(WORDS, k=400)) + "\n")
    recipe = tiny_recipe([str(one_line)], steps=2)
    with pytest.raises(LmforgeError, match=r"the validation split is empty .* data\.val_fraction=0"):
        pretrain(recipe, tmp_path / "a")
    recipe["data"]["val_fraction"] = 0.0
    recipe["train"]["eval_every"] = 1
    result, _ = pretrain(recipe, tmp_path / "b")
    assert result.eval == {}  # no evaluation at all, rather than one on the training data
    assert "no validation split; evaluation is off" in capsys.readouterr().err


def test_a_checkpoint_folder_is_a_model_directory(finished_run, capsys):
    step = checkpoints_dir(finished_run) / "step-000002"
    model, tok = lmforge.load(step)
    assert tok is not None and model.config.d_model == 32
    assert main(["generate", "--model", str(step), "--max-new-tokens", "3", "--prompt", "the king"]) == 0, \
        capsys.readouterr().err


def test_outputs_never_overwrite_inputs_or_another_artefact(tmp_path, corpus, encoder_dir, labeled, capsys):
    def refused(*argv: str, match: str) -> None:
        assert main(list(argv)) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err

    tok = ["tokenizer", "train", "--kind", "bpe", "--min-frequency", "1", "--quiet", str(corpus)]
    assert main([*tok, "--vocab-size", "80", "--out", str(tmp_path / "tok")]) == 0
    assert main([*tok, "--vocab-size", "80", "--out", str(tmp_path / "tok")]) == 0  # the same output again
    refused(*tok, "--vocab-size", "90", "--out", str(tmp_path / "tok"), match="holds another tokenizer (vocab_size")
    assert main([*tok, "--vocab-size", "90", "--out", str(tmp_path / "tok"), "--overwrite"]) == 0
    not_ours = "that lmforge did not write (checksums.json, config.json"  # a model saved outside any command
    refused(*tok, "--vocab-size", "90", "--out", str(encoder_dir), match=not_ours)
    (tmp_path / "file").write_text("x")
    refused(*tok, "--vocab-size", "90", "--out", str(tmp_path / "file"), match="is a file, not a directory")

    prep = ["data", "prepare", "--workers", "1", "--quiet", str(corpus), "--out", str(tmp_path / "shards")]
    assert main([*prep, "--tokenizer", str(tmp_path / "tok")]) == 0
    refused(*prep, "--tokenizer", str(encoder_dir), match="holds another corpus (tokenizer:")

    convert = ["convert", "--to-hf", str(encoder_dir), "--out"]
    refused(*convert, str(encoder_dir / "hf"), match="is inside the input directory")
    assert main([*convert, str(tmp_path / "hf")]) == 0
    refused("convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "hf"),
            match="the output directory is the input directory")
    refused("convert", "--from-hf", str(tmp_path / "hf"), "--out", str(encoder_dir), match=not_ours)
    refused("convert", "--from-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "tok"),
            match="holds a tokenizer, not a model")

    ft = finetune_args(encoder_dir, labeled, tmp_path / "ft", "lora")
    refused(*finetune_args(encoder_dir, labeled, encoder_dir), match="the output directory is the input directory")
    assert main([*ft[:-2], "--max-steps", "2"]) == 0
    capsys.readouterr()
    full = [*finetune_args(encoder_dir, labeled, tmp_path / "ft", "full")[:-2], "--max-steps", "2"]
    refused(*full, match="holds another finetune (strategy: lora, not full)")
    assert main([*full, "--overwrite"]) == 0
    names = {p.name for p in (tmp_path / "ft").iterdir()}
    assert "model.safetensors" in names and "adapter.safetensors" not in names  # never side by side


# -- 4. bounded and explicit ----------------------------------------------------------------------------------------
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs to fill needs root")
def test_a_full_disk_is_one_line_and_the_previous_checkpoint_stays(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)]).returncode:
        pytest.skip("mount -t tmpfs failed (no CAP_SYS_ADMIN in this container)")
    try:
        class FillDisk(Callback):  # after the first checkpoint, leave 24 KiB free: the next cannot fit
            def on_save(self, trainer, step, path):
                free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
                (disk / "filler").write_bytes(b"\0" * max(0, free - 24 * 1024))

        torch.manual_seed(0)
        with pytest.raises(LmforgeError) as err:
            train(ToyLM(d=96), ToySource(4), toy_config(save_every=1, keep_last=0), disk / "run",
                  callbacks=[FillDisk()])
        message = str(err.value)
        assert message.startswith(f"{disk / 'run' / 'checkpoints'}: no space left on the device while saving "
                                  "step-000002 (it needs about ")
        assert latest_checkpoint(disk / "run", verify=True).step == 1
        assert not list(checkpoints_dir(disk / "run").glob(".tmp-*"))
        # corpus preparation on the full disk: one line too, and no half-written shard left behind
        from lmforge.data.corpus import prepare_corpus
        from lmforge.tokenizers import ByteLevelBPETokenizer

        text = write_corpus(tmp_path / "big.txt", lines=3000)
        tok = ByteLevelBPETokenizer.train(["the king and queen"], vocab_size=260, min_frequency=1)
        with pytest.raises(LmforgeError, match=r"corpus: no space left on the device while writing the corpus"):
            prepare_corpus([text], tok, disk / "corpus", workers=1, progress=False)
        assert not [p.name for p in (disk / "corpus").iterdir() if "tmp" in p.name]
    finally:
        subprocess.run(["umount", str(disk)])


GROWTH = """import sys
from lmforge.cli.main import main
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))
argv, big, small, out = sys.argv[1:-3], *sys.argv[-3:]
assert main([*argv, "--out", out + "-warm", small]) == 0  # imports and caches first: not the input's cost
open("/proc/self/clear_refs", "w").write("5")  # reset the peak resident memory (VmHWM)
before = status("VmRSS")
assert main([*argv, "--out", out, big]) == 0
print(status("VmHWM") - before)
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="needs Linux's /proc/self/clear_refs")
def test_one_line_of_20_mb_stays_within_a_few_times_its_size(tmp_path):
    rng = random.Random(0)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(3000)]
    big = tmp_path / "line.txt"
    big.write_text(" ".join(rng.choices(vocabulary, k=3_400_000)))  # ~20 MB, no newline
    size = big.stat().st_size
    assert size > 19e6 and b"\n" not in big.read_bytes()
    small = write_corpus(tmp_path / "small.txt", lines=5)

    def growth(*argv: str) -> float:
        """Peak resident memory of the command on the big file, above what it held before, per input byte."""
        done = subprocess.run([sys.executable, "-c", GROWTH, *argv, str(big), str(small), str(tmp_path / argv[1])],
                              env=child_env(), capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1]) / size

    tokenizer = growth("tokenizer", "train", "--kind", "byte-bpe", "--vocab-size", "300", "--workers", "1", "--quiet")
    assert tokenizer < 3, f"tokenizer training grew by {tokenizer:.1f}x the input"  # was 44x (2.2 GB for 50 MB)
    prepare = growth("data", "prepare", "--tokenizer", str(tmp_path / "train"), "--workers", "1", "--quiet",
                     "--val-fraction", "0")
    assert prepare < 6, f"data preparation grew by {prepare:.1f}x the input"


def test_resume_warns_in_one_line_when_threads_differ(tmp_path, capsys):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        train(ToyLM(), ToySource(4), toy_config(max_steps=3), tmp_path)
        assert json.loads((checkpoints_dir(tmp_path) / "step-000003" / "trainer.json").read_text())["threads"] == 1
        capsys.readouterr()
        torch.set_num_threads(2)
        train(ToyLM(), ToySource(4), toy_config(max_steps=4), tmp_path)
    finally:
        torch.set_num_threads(threads)
    lines = [line for line in capsys.readouterr().err.splitlines() if "threads 1 -> 2" in line]
    assert len(lines) == 1 and "not bit-identical" in lines[0]


# -- 5. one writer per run directory --------------------------------------------------------------------------------
def test_a_second_writer_fails_at_once_naming_the_holder_and_a_killed_holder_leaves_no_lock(
        tmp_path, recipe_file, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom lmforge.lock import RunLock\n"
                               "RunLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(60)", str(out)],
                              env=child_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.perf_counter()
        assert main(["pretrain", "--config", str(recipe_file), "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"lmforge: error: {out.resolve()}: in use by another lmforge run (pid {holder.pid}); wait " \
                      "for it to finish or choose another --out"
        assert time.perf_counter() - start < 5
    finally:
        holder.kill()
        holder.wait()
    with RunLock(out):  # the kernel dropped the dead holder's lock: nothing stale to delete
        pass


# -- 6, 7. one line for bad input ------------------------------------------------------------------------------
def test_bad_values_say_why(tmp_path):
    from lmforge.data.tasks import read_classification

    with pytest.raises(LmforgeError, match=r"train\.warmup_steps: must be smaller than max_steps \(50\), got 100"):
        TrainConfig(warmup_steps=100, max_steps=50)
    with pytest.raises(LmforgeError, match=r"train\.min_lr: must be between 0 and lr \(0\.01\), got 0\.1"):
        TrainConfig(lr=0.01, min_lr=0.1)
    csv = tmp_path / "a.csv"
    csv.write_text("a,b\n1,good text\n0,bad text\n")
    with pytest.raises(LmforgeError, match=r"a\.csv: the header names neither 'text' nor 'label' \(columns: a, b\)"):
        read_classification(csv)


def test_invalid_utf8_and_nul_corpora_name_the_file_and_offset(tmp_path):
    from lmforge.data.corpus import prepare_corpus
    from lmforge.tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer.train(["some text here"], vocab_size=260, min_frequency=1)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"good text\n\xff bad")
    with pytest.raises(LmforgeError, match=r"bad\.txt:2: invalid UTF-8 at byte offset 10 .*data\.errors=replace"):
        prepare_corpus([bad], tok, tmp_path / "c", workers=1, progress=False)
    assert prepare_corpus([bad], tok, tmp_path / "c", workers=1, progress=False, errors="replace")["characters"]
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\0\0\0")
    with pytest.raises(LmforgeError, match=r"nul\.txt: holds a NUL byte at byte offset 4"):
        prepare_corpus([nul], tok, tmp_path / "d", workers=1, progress=False)


# -- 8. special tokens written in text --------------------------------------------------------------------------
def test_special_tokens_in_text_follow_the_reference_libraries(tmp_path, corpus):
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    from lmforge.tokenizers import WordPieceTokenizer, load_tokenizer

    hf = tokenizers.Tokenizer(tokenizers.models.BPE())
    hf.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                             initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet())
    hf.train([str(corpus)], trainer)
    hf.save(str(tmp_path / "tokenizer.json"))
    ours = load_tokenizer(tmp_path / "tokenizer.json")
    for text in ("<|endoftext|> as text", "the king<|endoftext|>the queen", "plain text only"):
        assert ours.encode(text).ids == hf.encode(text).ids, text
    plain = ours.encode("<|endoftext|> as text", allow_special=False).ids  # --no-allow-special
    assert ours.special_tokens["<|endoftext|>"] not in plain

    trained = WordPieceTokenizer.train([corpus.read_text()], vocab_size=120, min_frequency=1)
    (tmp_path / "vocab.txt").write_text("\n".join(trained.id_to_token) + "\n")
    bert = transformers.BertTokenizerFast(vocab=str(tmp_path / "vocab.txt"))  # transformers 5: vocab=
    ours = load_tokenizer(tmp_path / "vocab.txt")
    text = "[CLS] the king [SEP] rode out"
    assert ours.encode(text).ids == bert(text)["input_ids"]
    assert not trained.specials_in_text  # lmforge-trained: special tokens in text are plain text by default
    assert trained.special_tokens["[SEP]"] not in trained.encode(text, add_special_tokens=False).ids


# -- 9. two processes: a signal to one stops both at the same step; a killed one ends the other ------------------
def start_two_processes(out: Path, rank_env: dict[int, dict[str, str]], *args: str) -> list[subprocess.Popen]:
    """tests/train_toy.py as rank 0 and rank 1 of one gloo group (no torchrun: a dead rank is not cleaned up)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in (0, 1):
        env = child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                        WORLD_SIZE="2", **rank_env.get(rank, {}))
        procs.append(subprocess.Popen([sys.executable, str(TOY), "--out", str(out), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 90) -> list[str]:
    try:
        return [p.communicate(timeout=timeout)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.slow
def test_a_signal_to_one_process_stops_every_process_after_the_same_step(tmp_path):
    step = random.randint(2, 6)
    procs = start_two_processes(tmp_path / "run", {0: {"LMFORGE_TEST_SIGNAL_AT_STEP": f"{step}:TERM"}},
                                "--steps", "50", "--save-every", "100")
    errors = finish(procs)
    assert [p.returncode for p in procs] == [143, 143], errors
    for rank, err in enumerate(errors):
        assert f"rank {rank}: stopped by SIGTERM after step {step}; checkpoint {tmp_path / 'run'}" in err
    assert latest_checkpoint(tmp_path / "run", verify=True).step == step


@pytest.mark.slow
def test_a_killed_rank_ends_the_other_with_a_clear_error_within_the_timeout(tmp_path):
    start = time.perf_counter()
    procs = start_two_processes(tmp_path / "run", {1: {"LMFORGE_TEST_KILL_AT_STEP": "3"}},
                                "--steps", "50", "--save-every", "2", "--dist-timeout", "20")
    err = finish(procs)[0]
    assert procs[1].returncode == -signal.SIGKILL
    assert procs[0].returncode == 2, err[-2000:]
    assert "another process of the run failed or did not answer within train.dist_timeout=20 s" in err
    assert time.perf_counter() - start < 60


def test_resume_refuses_when_no_checkpoint_verifies_and_keeps_the_log(tmp_path):
    torch.manual_seed(0)
    train(ToyLM(), ToySource(4), toy_config(), tmp_path)
    log = (tmp_path / "log.jsonl").read_bytes()
    for checkpoint in checkpoints_dir(tmp_path).glob("step-*"):
        data = bytearray((checkpoint / "optimizer.pt").read_bytes())
        data[len(data) // 2] ^= 0xFF
        (checkpoint / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(LmforgeError, match=r"none of its 2 checkpoints verifies .* --no-verify"):
        Trainer(ToyLM(), ToySource(4), toy_config(max_steps=8), tmp_path).setup()
    assert (tmp_path / "log.jsonl").read_bytes() == log  # the record of the run is kept


def test_a_checkpoints_tokenizer_is_verified_too(tmp_path, finished_run):
    """A checkpoint's config.json points at its run's tokenizer, outside the checkpoint: that file is checked
    against the tokenizer folder's own manifest (swapping two ids used to load silently)."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    step = checkpoints_dir(run) / "step-000004"
    lmforge.load(step)  # intact: loads
    path = run / "tokenizer" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["special_tokens"] = data.get("special_tokens", {})  # any edit that still parses (ids swapped, say)
    path.write_text(json.dumps(data, indent=2))
    with pytest.raises(LmforgeError, match=r"tokenizer\.json: \d+ bytes, checksums\.json records \d+"):
        lmforge.load(step)


def test_convert_does_not_launder_a_corrupt_model(tmp_path, encoder_dir, capsys):
    """convert --to-hf reads through the same check as lmforge.load: no fresh manifest over bad bytes."""
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(encoder_dir, bad)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[-10] ^= 0x01
    (bad / "model.safetensors").write_bytes(bytes(data))
    assert main(["convert", "--to-hf", str(bad), "--out", str(tmp_path / "hf")]) == 2
    assert "model.safetensors: sha256 differs" in capsys.readouterr().err
    assert not (tmp_path / "hf").exists()


def test_a_runs_tokenizer_without_its_manifest_is_refused_on_load_and_resume(tmp_path, finished_run, corpus):
    import shutil

    from lmforge.workflows.pretrain import pretrain

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (run / "tokenizer" / MANIFEST_NAME).unlink()
    with pytest.raises(LmforgeError, match=r"checksums\.json is missing"):
        lmforge.load(checkpoints_dir(run) / "step-000004")
    recipe = tiny_recipe([str(corpus)], steps=6)
    recipe["train"]["save_every"] = 2
    with pytest.raises(LmforgeError, match=r"tokenizer: lmforge wrote this but its checksums\.json is missing"):
        pretrain(recipe, run)


def test_an_adapter_records_the_base_it_was_trained_on_not_a_later_one(tmp_path, encoder_dir, labeled, monkeypatch,
                                                                       capsys):
    """A base rewritten while LoRA trains (a running pretrain saving over it): the adapter keeps the sha256 of
    the weights it loaded, so it refuses the new base instead of pairing with weights it never saw."""
    import shutil

    from lmforge.files import sha256_file
    from lmforge.workflows import finetune as ft

    base = tmp_path / "base"
    shutil.copytree(encoder_dir, base)
    trained_on = sha256_file(base / "model.safetensors")
    real_fit = ft.fit

    def fit_then_rewrite_the_base(*args, **kwargs):
        result = real_fit(*args, **kwargs)
        model, tok = lmforge.load(base)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        from lmforge.models import save_pretrained

        save_pretrained(model, base, tok)
        return result

    monkeypatch.setattr(ft, "fit", fit_then_rewrite_the_base)
    assert main(list(finetune_args(base, labeled, tmp_path / "lora", "lora"))) == 0
    record = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert record["base_model_sha256"] == trained_on != sha256_file(base / "model.safetensors")
    with pytest.raises(LmforgeError, match="sha256 differs"):
        lmforge.load(tmp_path / "lora")


def test_shards_edited_after_preparation_are_refused(tmp_path, corpus):
    """Prepared shards carry their content's sha256: an in-vocabulary edit (trained on silently before) is
    refused by name, and an id outside the vocabulary too even unverified (an IndexError before)."""
    from lmforge.data.corpus import TokenShard, prepare_corpus
    from lmforge.tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer.train([corpus.read_text()], 280, 1)
    prepare_corpus([corpus], tok, tmp_path / "shards", workers=1, progress=False)
    shard = TokenShard.open(tmp_path / "shards", "train", tok)
    tokens = np.fromfile(tmp_path / "shards" / "train.tokens", dtype=shard.tokens.dtype)
    tokens[5] = (int(tokens[5]) + 1) % tok.vocab_size  # still a valid id
    tokens.tofile(tmp_path / "shards" / "train.tokens")
    with pytest.raises(LmforgeError, match=r"train\.tokens: sha256 differs from checksums\.json"):
        TokenShard.open(tmp_path / "shards", "train", tok)
    tokens[5] = tok.vocab_size + 7
    tokens.tofile(tmp_path / "shards" / "train.tokens")
    from lmforge.manifest import set_verify

    set_verify(False)
    try:
        with pytest.raises(LmforgeError, match=r"outside the vocabulary"):
            TokenShard.open(tmp_path / "shards", "train", tok)
    finally:
        set_verify(True)


def test_a_tokenizer_larger_than_the_model_is_refused_on_load(tmp_path, capsys):
    from lmforge.models import Decoder, get_preset, save_pretrained
    from lmforge.tokenizers import ByteLevelBPETokenizer

    tok = ByteLevelBPETokenizer.train(["the cat sat on the mat " * 20], 300, 1)
    save_pretrained(Decoder(get_preset("gpt-tiny", vocab_size=200, max_positions=32)), tmp_path / "m", tok)
    for argv in (["generate", "--model", str(tmp_path / "m"), "--prompt", "the"],
                 ["attention", "--model", str(tmp_path / "m"), "--text", "the cat", "--out", str(tmp_path / "a.png")],
                 ["embed", "--model", str(tmp_path / "m"), "the cat"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{tok.vocab_size} tokens but the model only 200 embedding rows" in err, err


def test_labels_that_look_like_free_text_get_a_warning(tmp_path, capsys, encoder_dir, labeled):
    """1,000 distinct labels in 3,000 rows is almost surely the wrong column: training goes on, with a word."""
    from lmforge.cli import main

    rng = random.Random(2)
    sparse = tmp_path / "sparse.csv"
    sparse.write_text("text,label\n" + "".join(f"{' '.join(rng.choices(WORDS, k=4))},id{i % 1000}\n"
                                               for i in range(3000)))
    for path, warned in ((sparse, True), (labeled, False)):
        args = [a for a in finetune_args(encoder_dir, path, tmp_path / path.stem) if a != "--quiet"]
        assert main([*args[:args.index("--max-steps")], "--max-steps", "1", *args[args.index("--batch-size"):]]) == 0
        err = capsys.readouterr().err
        expected = f"lmforge: warning: {path}: 1,000 distinct labels in 3,000 rows (3.0 a label): is the label column"
        assert (expected in err) is warned and err.count("distinct labels") == int(warned), err


FULL_DISK_COMMANDS = {  # every command that writes files, its output inside the full disk {d}
    "tokenizer train": "tokenizer train --kind byte-bpe --vocab-size 300 --out {d}/tok {corpus}",
    "data prepare": "data prepare --tokenizer {encoder} --out {d}/shards {corpus}",
    "pretrain": "pretrain --config {recipe} --out {d}/run",
    "finetune": "finetune --model {encoder} --task seq-cls --train {labeled} --out {d}/ft --strategy full "
                "--max-steps 2 --batch-size 8 --no-progress",
    "convert --to-hf": "convert --to-hf {encoder} --out {d}/hf",
    "embed --out": "embed --model {encoder} --out {d}/vectors.npy the king rode out",
    "attention --out": "attention --model {encoder} --text 'the king rode out at dawn' --out {d}/page.html",
    "translate --out": "translate --model {s2s} --eval {pairs} --out {d}/translations.txt",
    "translate --align": "translate --model {s2s} 'the king' --align {d}/align.png",
}


@pytest.fixture(scope="module")
def s2s_dir(tmp_path_factory, corpus) -> Path:
    from lmforge.models import Seq2Seq, Seq2SeqConfig, save_pretrained
    from lmforge.tokenizers import ByteLevelBPETokenizer

    out = tmp_path_factory.mktemp("s2s") / "model"
    tok = ByteLevelBPETokenizer.train([corpus.read_text()], vocab_size=280, min_frequency=1)
    torch.manual_seed(0)
    config = Seq2SeqConfig(vocab_size=tok.vocab_size, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                           n_decoder_layers=1, max_positions=64, bos_id=tok.eos_id, eos_id=tok.eos_id, pad_id=0)
    save_pretrained(Seq2Seq(config), out, tok)
    (out.parent / "pairs.tsv").write_text("the king\tel rey\nthe queen\tla reina\n")
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs to fill needs root")
@pytest.mark.parametrize("command", FULL_DISK_COMMANDS)
def test_every_writing_command_on_a_full_disk_says_so_in_one_line_and_leaves_no_partial_file(
        tmp_path, capsys, command, corpus, encoder_dir, labeled, recipe_file, s2s_dir):
    """A disk with 2 KiB left: each command fails in one line naming the lack of space, and what it leaves
    behind is only whole files (no empty or temporary one, nothing truncated that claims to be complete)."""
    import shlex

    from lmforge.cli import main

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)]).returncode:
        pytest.skip("mount -t tmpfs failed (no CAP_SYS_ADMIN in this container)")
    try:
        stat = os.statvfs(disk)
        (disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - 2048))
        argv = shlex.split(FULL_DISK_COMMANDS[command].format(d=disk, corpus=corpus, encoder=encoder_dir,
                                                              labeled=labeled, recipe=recipe_file, s2s=s2s_dir,
                                                              pairs=s2s_dir.parent / "pairs.tsv"))
        code = main([*argv, "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("lmforge: error: "), err
        assert "no space left" in err[0].lower(), err[0]
        left = [p for p in disk.rglob("*") if p.is_file() and p.name != "filler"]
        partial = [p.name for p in left if p.stat().st_size == 0 or ".tmp" in p.name]
        assert partial == [], (err, [(p.name, p.stat().st_size) for p in left])
    finally:
        subprocess.run(["umount", str(disk)])
