"""Start-up time of the ``lmforge`` command: what a script or a pipe pays on every call.

Runs each command N times in a fresh process and keeps the fastest (the least disturbed by other work),
for this checkout and, with ``--before SRC``, for another source tree (e.g. a checkout of an older commit:
``git worktree add /tmp/before COMMIT`` then ``--before /tmp/before/src``). ``python -c "import torch"``
is printed beside them: what any command that needs torch pays at least.

    python bench/startup.py [--before /tmp/before/src] [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def fastest(argv: list[str], src: Path, repeat: int) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, env=env, capture_output=True, check=True)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="another lmforge src/ directory to compare with")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "c.txt"
        corpus.write_text("the cat sat on the mat\nhello world\n" * 50, encoding="utf-8")
        lm = [sys.executable, "-m", "lmforge.cli"]
        subprocess.run([*lm, "tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "80", "--min-frequency",
                        "1", "--out", f"{tmp}/tok", str(corpus), "--quiet"], check=True, capture_output=True,
                       env={**os.environ, "PYTHONPATH": str(SRC)})
        cases = {
            "lmforge --version": [*lm, "--version"],
            "lmforge generate --help": [*lm, "generate", "--help"],
            "lmforge tokenizer encode (one line)": [*lm, "tokenizer", "encode", "--tokenizer", f"{tmp}/tok", "hello"],
        }
        floor = fastest([sys.executable, "-c", "import torch"], SRC, args.repeat)
        print(f"python -c 'import torch': {floor:.2f} s (what a command that needs torch pays at least)")
        print("| command | before | now | before / now |" if args.before else "| command | now |")
        print("| --- | ---: | ---: | ---: |" if args.before else "| --- | ---: |")
        for name, argv in cases.items():
            now = fastest(argv, SRC, args.repeat)
            if args.before:
                before = fastest(argv, args.before, args.repeat)
                print(f"| `{name}` | {before:.2f} s | {now:.2f} s | {before / now:.1f}x |")
            else:
                print(f"| `{name}` | {now:.2f} s |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
