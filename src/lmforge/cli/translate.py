"""``lmforge translate``: translate sentences with a trained encoder-decoder, score a test set, plot alignments.

    lmforge translate --model runs/seq2seq-mini/model "In the beginning God created the heavens."
    lmforge translate --model DIR --beams 4 < sentences.txt            # one JSON object per line
    lmforge translate --model DIR --eval test.tsv --out hyps.txt       # BLEU and chrF (sacrebleu)
    lmforge translate --model DIR --align align.png "God is love."     # cross-attention heatmap

With ``--eval FILE`` (source<TAB>reference lines) the scores go to standard output as one JSON object,
and ``--out`` keeps the translations, one per line. ``--eval bible`` is the held-out Bible books
(Ruth, Jonah, Philippians, James) of ``lmforge.data.sources.bible_pairs``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from lmforge.cli.common import Settings, add_quiet, add_settings, input_lines
from lmforge.generation.options import DecodeOptions
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime, TextInput, TranslateOptions

SETTINGS = Settings(Recipe({"decode": DecodeOptions, "translate": TranslateOptions, "input": TextInput,
                            "runtime": Runtime}), flags=("decode", "translate", "input", "runtime"),
                    defaults={"decode.beams": 4, "decode.batch_size": 32})


def run_translate(args: argparse.Namespace) -> int:
    from lmforge import load
    from lmforge.errors import LmforgeError
    from lmforge.models.interfaces import is_encoder_decoder
    from lmforge.outputs import claim_file
    from lmforge.workflows.translate import alignment, evaluate_translation, plot_alignment, translate

    if args.align and Path(args.align).suffix.lower() not in (".png", ".pdf", ".svg"):
        raise LmforgeError(f"--align: {args.align} must end in .png, .pdf or .svg")
    for flag, target in (("--out", args.out), ("--align", args.align)):  # before the work, not after it
        if target is None:
            continue
        claim_file(target, args.overwrite, inputs=[args.eval], what=flag)
        folder = Path(target).resolve().parent
        if not (folder.is_dir() and os.access(folder, os.W_OK)):
            raise LmforgeError(f"{flag}: cannot write into {folder} (missing or read-only)")
    if args.eval:
        from lmforge.workflows.translate import require_sacrebleu

        require_sacrebleu()
    decode, options = args.settings["decode"], args.settings["translate"]
    model, tokenizer = load(args.model, device=args.settings["runtime"].device)
    if not is_encoder_decoder(model):
        raise LmforgeError(f"--model: {args.model}: a {type(model).__name__} model is not an encoder-decoder")
    if tokenizer is None:
        raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
    if args.eval:
        path = args.eval
        if path == "bible":
            from lmforge.data import sources

            path = sources.bible_pairs()["test"]
        result = evaluate_translation(model, tokenizer, path, beams=decode.beams, length_penalty=decode.length_penalty,
                                      limit=options.limit, batch_size=decode.batch_size)
        if args.out:
            from lmforge.files import write_text_atomic

            write_text_atomic(args.out, "\n".join(result["hypotheses"]) + "\n")
        samples = [{"source": s, "reference": r, "translation": h}
                   for (s, r), h in zip(result["pairs"][:3], result["hypotheses"][:3], strict=True)]
        report = {k: v for k, v in result.items() if k not in ("hypotheses", "pairs")}
        print(json.dumps({**report, "file": str(path), "samples": samples}, ensure_ascii=False))
        return 0
    texts = list(input_lines(args.text, skip_blank=True, errors=args.settings["input"].errors))
    if args.align:
        if len(texts) != 1:
            raise LmforgeError("--align: give exactly one sentence")
        target = args.target or translate(model, tokenizer, texts, beams=decode.beams)[0]
        plot_alignment([(f"{type(model).__name__}", alignment(model, tokenizer, texts[0], target))], args.align)
        print(json.dumps({"source": texts[0], "translation": target, "alignment": args.align}, ensure_ascii=False))
        return 0
    for source, target in zip(texts, translate(model, tokenizer, texts, beams=decode.beams,
                                               length_penalty=decode.length_penalty, batch_size=decode.batch_size),
                              strict=True):
        print(json.dumps({"source": source, "translation": target}, ensure_ascii=False), flush=True)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("translate", help="translate with an encoder-decoder; --eval scores BLEU/chrF",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="?", metavar="TEXT", help="a sentence (default: one per line of standard input)")
    p.add_argument("--model", metavar="DIR", required=True, help="an encoder-decoder model directory")
    p.add_argument("--eval", metavar="FILE", help="source<TAB>reference file to score (or 'bible')")
    p.add_argument("--out", metavar="FILE", help="with --eval: write the translations here, one per line")
    p.add_argument("--align", metavar="PNG", help="plot the cross-attention of TEXT and its translation")
    p.add_argument("--target", metavar="TEXT", help="with --align: the target to align (default: translate)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing file at --out or --align "
                   "(without it an existing file is refused before any work)")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_translate)
