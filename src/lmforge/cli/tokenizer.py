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

from lmforge.cli.common import OVERWRITE_HELP, Settings, add_quiet, add_settings, input_lines
from lmforge.errors import LmforgeError
from lmforge.schema import Recipe
from lmforge.workflows.options import EncodeOptions, TextInput
from lmforge.workflows.pretrain_args import TokenizerSection

TRAIN = Settings(Recipe({"tokenizer": TokenizerSection, "input": TextInput}), flags=("tokenizer", "input"))
CODEC = Settings(Recipe({"encode": EncodeOptions, "input": TextInput}), flags=("encode", "input"))


def train(args: argparse.Namespace) -> int:
    from lmforge.outputs import claim_output
    from lmforge.tokenizers import KINDS
    from lmforge.tokenizers.train import read_corpus

    section: TokenizerSection = args.settings["tokenizer"]
    if section.kind is None:
        raise LmforgeError("--kind: required (bpe | byte-bpe | wordpiece)")
    identity = {"kind": section.kind, "vocab_size": section.vocab_size, "min_frequency": section.min_frequency,
                **section.options(), "files": [str(Path(f).resolve()) for f in args.files]}
    with claim_output(args.out, "tokenizer", identity, args.overwrite):
        texts = read_corpus(args.files, errors=args.settings["input"].errors)
        workers = section.workers or min(4, os.cpu_count() or 1)
        tok = KINDS[section.kind].train(texts, section.vocab_size, section.min_frequency, workers=workers,
                                        progress=not args.quiet, **section.options())
        path = tok.save(args.out)
    if tok.vocab_size < section.vocab_size:
        print(f"lmforge tokenizer train: stopped at {tok.vocab_size} tokens, short of --vocab-size "
              f"{section.vocab_size}: no pair of symbols occurs --min-frequency {section.min_frequency} times any more "
              "(a larger corpus or a lower --min-frequency gives more)", file=sys.stderr)
    print(json.dumps({"kind": tok.kind, "vocab_size": tok.vocab_size, "requested_vocab_size": section.vocab_size,
                      "path": str(path)}))
    return 0


def encode(args: argparse.Namespace) -> int:
    from lmforge.tokenizers import load_tokenizer

    opts: EncodeOptions = args.settings["encode"]
    tok = load_tokenizer(args.tokenizer)
    for line in input_lines(args.text, errors=args.settings["input"].errors):  # allow_special None: by origin
        enc = tok.encode(line, add_special_tokens=opts.special, allow_special=opts.allow_special)
        record = {"ids": enc.ids, "tokens": enc.tokens}
        if opts.offsets:
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
    for n, line in enumerate(input_lines(args.ids, errors=args.settings["input"].errors), start=1):
        if not line.strip():
            continue
        where = "IDS" if args.ids is not None else f"<stdin> line {n}"
        text = tok.decode(_parse_ids(line, where), skip_special_tokens=args.settings["encode"].skip_special)
        print(json.dumps({"text": text}, ensure_ascii=False))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    """Register ``lmforge tokenizer {train,encode,decode}``."""
    group = sub.add_parser("tokenizer", help="train a tokenizer, encode text, decode ids",
                           description="Train BPE, byte-level BPE or WordPiece tokenizers; encode and decode.")
    commands = group.add_subparsers(dest="tokenizer_command", metavar="ACTION", required=True)

    p = commands.add_parser("train", help="learn a vocabulary from text files",
                            description="Learn a tokenizer from UTF-8 text files and save it into --out.")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for tokenizer.json and the vocabulary")
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_settings(p, TRAIN)
    add_quiet(p)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(handler=train)

    p = commands.add_parser("encode", help="text -> one JSON object (ids, tokens) per input line",
                            description="Encode TEXT, or standard input one line at a time.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="directory or tokenizer.json / vocab.txt")
    p.add_argument("text", nargs="?", metavar="TEXT")
    add_settings(p, CODEC)
    add_quiet(p)
    p.set_defaults(handler=encode)

    p = commands.add_parser("decode", help="ids -> one JSON object (text) per input line",
                            description="Decode IDS (e.g. '[101, 7592]' or '101 7592'), or standard input.")
    p.add_argument("--tokenizer", required=True, metavar="DIR", help="directory or tokenizer.json / vocab.txt")
    p.add_argument("ids", nargs="?", metavar="IDS")
    add_settings(p, CODEC)
    add_quiet(p)
    p.set_defaults(handler=decode)
