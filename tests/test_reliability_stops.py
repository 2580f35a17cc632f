"""Stops that leave nothing behind, and readers that go away (docs/training.md, "What lmforge guarantees"):
a signal during corpus tokenization ends the workers too and frees the lock; a closed pipe ends quietly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_reliability import child_env, write_corpus


def processes_mentioning(marker: str) -> list[int]:
    """PIDs (not this one) whose command line contains ``marker``: a forked worker keeps its parent's."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes().decode(errors="replace"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc to find surviving workers (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_tokenization_ends_every_worker_and_frees_the_lock(tmp_path, sig):
    from lmforge.tokenizers import ByteLevelBPETokenizer

    corpus = write_corpus(tmp_path / "big.txt", lines=200_000)
    tok = ByteLevelBPETokenizer.train([corpus.read_text()[:200_000]], 400, 2)
    tok.save(tmp_path / "tok")
    out = tmp_path / "shards-unique-marker"
    cmd = [sys.executable, "-m", "lmforge.cli", "data", "prepare", str(corpus), "--tokenizer", str(tmp_path / "tok"),
           "--out", str(out), "--workers", "2"]
    # a shell's background job ignores SIGINT, and so would the child: restore the default, as a terminal has it
    child = subprocess.Popen(cmd, env=child_env(), stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while len(processes_mentioning(str(out))) < 3 and time.monotonic() < deadline:  # the parent + 2 workers
        time.sleep(0.05)
    assert child.poll() is None, "tokenization ended before the signal could be sent: make the corpus larger"
    time.sleep(0.3)
    child.send_signal(sig)
    try:
        err = child.communicate(timeout=60)[1]
    finally:  # a failure here must not leave the child behind either
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 128 + sig, err
    assert err.count("lmforge: ") == 1 and "Traceback" not in err, err  # one line (after the progress bar's)
    deadline = time.monotonic() + 10
    while processes_mentioning(str(out)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_mentioning(str(out)) == []  # no orphan
    small = write_corpus(tmp_path / "small.txt", lines=50)
    again = subprocess.run([*cmd[:5], str(small), *cmd[6:], "--overwrite"], env=child_env(), capture_output=True,
                           text=True, timeout=120)
    assert again.returncode == 0, again.stderr  # the lock went with the run


def test_a_pool_whose_terminate_hangs_still_ends_its_workers():
    """CPython's Pool.terminate waits for the task queue's lock, which an idle worker holds while it waits for a
    task (python/cpython#78178). Stopped here (SIGSTOP), that worker never lets go: the workers are killed after
    the grace period instead, and none is left."""
    from lmforge.workers import end, pool

    with pool(2) as processes:
        assert processes.map(abs, [-1, -2]) == [1, 2]
        deadline = time.monotonic() + 10
        while processes._inqueue._rlock.acquire(block=False):  # until an idle worker holds the lock in get()
            processes._inqueue._rlock.release()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        workers = list(processes._pool)
        for worker in workers:
            os.kill(worker.pid, signal.SIGSTOP)
        began = time.monotonic()
        end(processes, grace=0.5)
        assert time.monotonic() - began < 5
        while any(w.is_alive() for w in workers) and time.monotonic() < deadline + 5:
            time.sleep(0.05)
        assert not any(w.is_alive() for w in workers)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path):
    """``lmforge ... | head -1``: exit 141 (as a shell's own tools), no traceback."""
    from lmforge.tokenizers import ByteLevelBPETokenizer

    ByteLevelBPETokenizer.train(["a b c d e f g " * 50], 280, 1).save(tmp_path / "tok")
    lines = "\n".join(["a b c d e f g"] * 20000) + "\n"
    # bash, not sh: ${PIPESTATUS[0]} is lmforge's own exit status (the pipeline's is head's 0)
    pipe = subprocess.Popen(["bash", "-c", f"{sys.executable} -m lmforge.cli tokenizer encode --tokenizer "
                             f"{tmp_path / 'tok'} | head -1; exit ${{PIPESTATUS[0]}}"], env=child_env(),
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    err = pipe.communicate(lines, timeout=120)[1]
    assert pipe.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_a_csv_field_of_any_length_is_read(tmp_path):
    """One text of 300,000 characters in a labeled CSV (Python's csv module stops at 131,072 by default)."""
    from lmforge.data.tasks import read_classification

    path = tmp_path / "long.csv"
    path.write_text('label,text\npos,"' + "word " * 60_000 + '"\nneg,short\n', encoding="utf-8")
    examples = read_classification(path)
    assert [len(e.text) for e in examples] == [300_000, 5] and [e.label for e in examples] == ["pos", "neg"]


def test_a_missing_scorer_is_reported_before_any_translating(tmp_path, capsys, monkeypatch):
    """``translate --eval`` without sacrebleu: one line at once, not after minutes of decoding."""
    from lmforge.cli.main import main

    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import sacrebleu -> ImportError
    assert main(["translate", "--model", str(tmp_path / "no-model-here"), "--eval", "bible"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sacrebleu" in err and "no-model-here" not in err, err
    assert main(["translate", "--model", str(tmp_path), "--eval", "x.tsv", "--out", "/proc/nope/t.txt"]) == 2
    assert "--out: cannot write into /proc/nope" in capsys.readouterr().err


@pytest.mark.parametrize("steps", [1, 2, 10, 49, 50, 51, 500])
def test_the_demo_runs_for_any_number_of_steps(steps):
    """``lmforge demo --steps N``: the recipe passes every check (warm-up shorter than the run), trains exactly N
    steps, evaluates and saves within them, and its learning rate never reaches 0 or passes the peak and ends at
    min_lr."""
    from lmforge.train.optim import lr_at
    from lmforge.workflows.demo import demo_recipe
    from lmforge.workflows.pretrain_args import PRETRAIN

    train = PRETRAIN.resolve(demo_recipe(steps))["train"]  # raises on a key out of range
    assert train.max_steps == steps and 0 <= train.warmup_steps < steps
    assert 1 <= train.eval_every <= steps and 1 <= train.save_every <= steps
    rates = [lr_at(step, train) for step in range(1, steps + 1)]
    assert all(0 < rate <= train.lr for rate in rates), rates
    assert rates[-1] == pytest.approx(train.min_lr)
