"""``lmforge data prepare``: text, JSONL, CSV, Parquet or Arrow files → memory-mapped token shards.

See lmforge.data.corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lmforge.cli.common import add_common, fraction, positive_int


def run_prepare(args: argparse.Namespace) -> int:
    from lmforge.data.corpus import prepare_corpus, tokenizer_fingerprint
    from lmforge.outputs import claim_output, record_output
    from lmforge.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer)
    identity = {"tokenizer": tokenizer_fingerprint(tokenizer), "files": [str(Path(f).resolve()) for f in args.files],
                "val_fraction": args.val_fraction, "doc_separator": args.doc_separator, "field": args.field,
                "seed": args.seed}
    claim_output(args.out, "corpus", identity, args.overwrite, inputs=[args.tokenizer])
    start = time.perf_counter()
    manifest = prepare_corpus(args.files, tokenizer, args.out, val_fraction=args.val_fraction,
                              doc_separator=args.doc_separator, field=args.field, workers=args.workers,
                              seed=args.seed, errors=args.errors)
    seconds = time.perf_counter() - start
    record_output(args.out, "corpus", identity, [p.name for p in Path(args.out).iterdir()
                                                if p.suffix in (".tokens", ".npy", ".json") and p.is_file()])
    print(f"prepared {manifest['characters']:,} characters in {seconds:.1f} s → {args.out}", file=sys.stderr)
    print(json.dumps({"out": str(args.out), "seconds": round(seconds, 2), **manifest["splits"]}))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    data = sub.add_parser("data", help="prepare corpora for pretraining")
    data_sub = data.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    p = data_sub.add_parser("prepare", help="tokenize files into memory-mapped train/valid shards")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help=".txt, .jsonl, .csv/.tsv, or (through Hugging Face datasets) .parquet, .arrow and "
                   "save_to_disk folders")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory or tokenizer.json")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--val-fraction", type=fraction, default=0.1, help="share of documents held out (default 0.1)")
    p.add_argument("--doc-separator", choices=["file", "blank-line"], default="file",
                   help="a .txt file is one document, or one per blank-line-separated block")
    p.add_argument("--field", default="text", help="JSONL field / CSV column holding the text (default: text)")
    p.add_argument("--workers", type=positive_int, default=None, help="tokenizing processes (default: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true",
                   help="replace shards of another tokenizer or other files (or other output) in --out")
    p.add_argument("--errors", choices=["strict", "replace"], default="strict",
                   help="invalid UTF-8: stop with the file and byte offset, or replace the bad bytes")
    add_common(p)
    p.set_defaults(handler=run_prepare)
