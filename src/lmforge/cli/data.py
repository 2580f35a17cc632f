"""``lmforge data prepare``: text, JSONL, CSV, Parquet or Arrow files → memory-mapped token shards.

See lmforge.data.corpus.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lmforge.cli.common import OVERWRITE_HELP, Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.pretrain_args import CorpusSection

SETTINGS = Settings(Recipe({"corpus": CorpusSection}), flags=("corpus",))


def run_prepare(args: argparse.Namespace) -> int:
    from lmforge.data.corpus import prepare_corpus, tokenizer_fingerprint
    from lmforge.outputs import claim_output
    from lmforge.tokenizers import load_tokenizer

    corpus: CorpusSection = args.settings["corpus"]
    tokenizer = load_tokenizer(args.tokenizer)
    identity = {"tokenizer": tokenizer_fingerprint(tokenizer), "files": [str(Path(f).resolve()) for f in args.files],
                "val_fraction": corpus.val_fraction, "doc_separator": corpus.doc_separator, "field": corpus.field,
                "seed": corpus.seed}
    start = time.perf_counter()
    with claim_output(args.out, "corpus", identity, args.overwrite, inputs=[args.tokenizer]):
        manifest = prepare_corpus(args.files, tokenizer, args.out, val_fraction=corpus.val_fraction,
                                  doc_separator=corpus.doc_separator, field=corpus.field, workers=corpus.workers,
                                  seed=corpus.seed, errors=corpus.errors)
    seconds = time.perf_counter() - start
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
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_prepare)
