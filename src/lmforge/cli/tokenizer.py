"""``lmforge tokenizer train | encode | decode``: a thin layer over ``lmforge.tokenizers``.

    lmforge tokenizer train --kind byte-bpe --vocab-size 8192 --out tok/ shakespeare.txt
    echo "Hello world" | lmforge tokenizer encode --tokenizer tok/
    lmforge tokenizer decode --tokenizer tok/ "[15496, 995]"

Results go to standard output as JSON lines; the training progress bar goes to standard error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from lmforge.cli.common import add_common, add_input_errors, input_lines, positive_int
from lmforge.errors import LmforgeError


def train(args: argparse.Namespace) -> int:
    from lmforge.outputs import claim_output, record_output
    from lmforge.tokenizers import KINDS
    from lmforge.tokenizers.train import read_corpus

    identity = {"kind": args.kind, "vocab_size": args.vocab_size, "min_frequency": args.min_frequency,
                "pattern": args.pattern if args.kind == "byte-bpe" else None,
                "files": [str(Path(f).resolve()) for f in args.files]}
    claim_output(args.out, "tokenizer", identity, args.overwrite)
    texts = read_corpus(args.files, errors=args.errors)
    cls = KINDS[args.kind]
    options = {"workers": args.workers, "progress": not args.quiet}
    if args.kind == "byte-bpe":
        options["pattern"] = args.pattern
    tok = cls.train(texts, args.vocab_size, args.min_frequency, **options)
    path = tok.save(args.out)
    record_output(args.out, "tokenizer", identity, ["tokenizer.json", "tokenizer.vocab"])
    if tok.vocab_size < args.vocab_size:
        print(f"lmforge tokenizer train: stopped at {tok.vocab_size} tokens, short of --vocab-size "
              f"{args.vocab_size}: no pair of symbols occurs --min-frequency {args.min_frequency} times any more "
              "(a larger corpus or a lower --min-frequency gives more)", file=sys.stderr)
    print(json.dumps({"kind": tok.kind, "vocab_size": tok.vocab_size, "requested_vocab_size": args.vocab_size,
                      "path": str(path)}))
    return 0


def encode(args: argparse.Namespace) -> int:
    from lmforge.tokenizers import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    allow = True if args.allow_special else False if args.special_as_text else None  # None: the origin decides
    for line in input_lines(args.text, errors=args.errors):
        enc = tok.encode(line, add_special_tokens=not args.no_special, allow_special=allow)
        record = {"ids": enc.ids, "tokens": enc.tokens}
        if args.offsets:
            record["offsets"] = enc.offsets
        print(json.dumps(record, ensure_ascii=False))
    return 0


def _parse_ids(line: str, where: str) -> list[int]:
    """``[1, 2, 3]``, ``1 2 3`` or ``1,2,3``; anything else is a one-line error."""
    line = line.strip()
    try:
        ids = json.loads(line) if line[:1] in "[{" else [int(x) for x in line.replace(",", " ").split()]
    except ValueError:
        raise LmforgeError(f"{where}: expected token ids such as [1, 2, 3], got {line[:60]!r}") from None
    if isinstance(ids, dict):
        ids = ids.get("ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise LmforgeError(f"{where}: expected a list of integer ids, got {line[:60]!r}")
    return ids


def decode(args: argparse.Namespace) -> int:
    from lmforge.tokenizers import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
    for n, line in enumerate(input_lines(args.ids, errors=args.errors), start=1):
        if not line.strip():
            continue
        where = "IDS" if args.ids is not None else f"<stdin> line {n}"
        text = tok.decode(_parse_ids(line, where), skip_special_tokens=args.skip_special)
        print(json.dumps({"text": text}, ensure_ascii=False))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``lmforge tokenizer {train,encode,decode}``."""
    group = sub.add_parser("tokenizer", help="train a tokenizer, encode text, decode ids",
                           description="Train BPE, byte-level BPE or WordPiece tokenizers; encode and decode.")
    commands = group.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)

    p = commands.add_parser("train", help="learn a vocabulary from text files",
                            description="Learn a tokenizer from UTF-8 text files and save it into --out.")
    p.add_argument("--kind", choices=["bpe", "byte-bpe", "wordpiece"], required=True)
    p.add_argument("--vocab-size", type=positive_int, required=True, metavar="N",
                   help="final vocabulary size, special tokens included")
    p.add_argument("--min-frequency", type=positive_int, default=2, metavar="F",
                   help="stop when no pair occurs F times (default 2: when none occurs more than once)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for tokenizer.json and the vocabulary")
    p.add_argument("--pattern", choices=["gpt2", "gpt4"], default="gpt2",
                   help="byte-bpe pre-tokenization pattern (default gpt2)")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with an error (default) or replace by U+FFFD")
    p.add_argument("--workers", type=positive_int, default=min(4, os.cpu_count() or 1),
                   help="processes counting words (default: up to 4)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different tokenizer (or other output) already in --out")
    add_common(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(handler=train)

    p = commands.add_parser("encode", help="text -> one JSON object (ids, tokens) per input line",
                            description="Encode TEXT, or standard input one line at a time.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="directory or tokenizer.json / vocab.txt")
    p.add_argument("--no-special", action="store_true", help="do not add [CLS]/[SEP] or other template tokens")
    special = p.add_mutually_exclusive_group()
    special.add_argument("--allow-special", action="store_true",
                         help="split special tokens written in the text out as tokens")
    special.add_argument("--special-as-text", action="store_true",
                         help="read special tokens written in the text as plain text (safe for untrusted input). "
                         "Default: as the tokenizer's origin does (Hugging Face tokenizer.json / vocab.txt: split "
                         "out; trained by lmforge: plain text)")
    p.add_argument("--offsets", action="store_true", help="also print character offsets")
    p.add_argument("text", nargs="?", metavar="TEXT")
    add_input_errors(p)
    add_common(p)
    p.set_defaults(handler=encode)

    p = commands.add_parser("decode", help="ids -> one JSON object (text) per input line",
                            description="Decode IDS (e.g. '[101, 7592]' or '101 7592'), or standard input.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="directory or tokenizer.json / vocab.txt")
    p.add_argument("--skip-special", action="store_true", help="leave out special tokens")
    p.add_argument("ids", nargs="?", metavar="IDS")
    add_input_errors(p)
    add_common(p)
    p.set_defaults(handler=decode)
