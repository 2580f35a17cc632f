"""``lmforge attention`` and ``lmforge embed``: look inside any model ``lmforge.load`` reads.

    lmforge attention --model DIR --text "Juventus lost from Ajax" --out juve.html        explorer page
    lmforge attention --model DIR --text "..." --out layer2.png --layer 2                 12 heads of layer 2
    lmforge attention --model DIR --text "..." --out rollout.png --rollout                rollout over layers
    lmforge embed --model DIR --out vectors.npy "first text" "second text"                (N, D) float32
    echo "one text a line" | lmforge embed --model DIR --layer 3 --pooling cls --out v.jsonl
    lmforge embed --model DIR --similar king                    nearest input embeddings (cosine)
    lmforge embed --model DIR --analogy man king woman          king - man + woman
    lmforge embed --model DIR --analogy A B C "text 1" "text 2"     the texts nearest to B - A + C
    lmforge embed --model DIR --query "who won?" "text 1" "text 2"   texts ranked by cosine to the query

Texts come from TEXT arguments, or from standard input one a line. Results go to standard output as
JSON lines; notes go to standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lmforge.cli.common import FILE_OVERWRITE_HELP, Settings, add_quiet, add_settings, input_lines, load_options
from lmforge.errors import LmforgeError
from lmforge.schema import Recipe
from lmforge.workflows.options import AttentionOptions, EmbedOptions, Runtime, TextInput, Weights

ATTENTION = Settings(Recipe({"attention": AttentionOptions, "input": TextInput, "runtime": Runtime}),
                     flags=("attention", "input", "runtime"))
EMBED = Settings(Recipe({"embed": EmbedOptions, "input": TextInput, "runtime": Runtime, "weights": Weights}),
                 flags=("embed", "input", "runtime", "weights"))


def _out_for(out: Path, n: int, total: int) -> Path:
    return out if total == 1 else out.with_name(f"{out.stem}-{n}{out.suffix}")


def display_name(model_dir: str) -> str:
    """A model's name for titles: its folder, with the parent when the folder is just ``model``."""
    path = Path(model_dir).resolve()
    return f"{path.parent.name}/{path.name}" if path.name == "model" else path.name


def _load(args: argparse.Namespace):
    from lmforge import load

    path = args.model
    model, tokenizer = load(path, **load_options(args))
    if tokenizer is None:
        raise LmforgeError(f"--model: {path} has no tokenizer file (tokenizer.json or vocab.txt)")
    return model, tokenizer


# -- lmforge attention ------------------------------------------------------------------------------------
def run_attention(args: argparse.Namespace) -> int:
    from lmforge.outputs import claim_file
    from lmforge.viz.attention import plot_attention, plot_rollout
    from lmforge.viz.explorer import write_attention_page
    from lmforge.workflows.inspect import attention_maps, attention_rollout

    opts: AttentionOptions = args.settings["attention"]
    out = Path(args.out)
    kind = out.suffix.lower()
    if kind not in (".png", ".html"):
        raise LmforgeError(f"--out: {out} must end in .png or .html")
    if opts.rollout and kind != ".png":
        raise LmforgeError("--rollout draws a PNG: give --out FILE.png")
    texts = list(input_lines(args.text, skip_blank=True, errors=args.settings["input"].errors))
    if not texts:
        raise LmforgeError("--text: no text given (argument or standard input)")
    for n in range(1, len(texts) + 1):  # every file this run writes, before the model is loaded
        claim_file(_out_for(out, n, len(texts)), args.overwrite)
    model, tokenizer = _load(args)
    name = opts.name or display_name(args.model)
    for n, text in enumerate(texts, 1):
        maps = attention_maps(model, tokenizer, text, target=args.target)
        path = _out_for(out, n, len(texts))
        view = maps.view(opts.view)
        if kind == ".html":
            write_attention_page(maps, path, model_name=name, view=opts.view, layer=opts.layer, head=opts.head)
        elif opts.rollout:
            if view.name == "cross":
                raise LmforgeError("--rollout: cross-attention has no rollout; choose --view encoder or decoder")
            plot_rollout(view.queries, attention_rollout(view.weights), path,
                         title=f"attention rollout, {name}, {view.label}")
        else:
            plot_attention(view, path, opts.layer, opts.head, title=f"{name}: {view.label}")
            others = [v for v in maps.views if v != view.name]
            if others and n == 1:
                print(f"lmforge: drew the {view.name} view; --view {' | '.join(others)} draws the others",
                      file=sys.stderr)
        shapes = {v.name: list(v.weights.shape) for v in maps.views.values()}
        print(json.dumps({"out": str(path), "text": text, "tokens": view.queries, "target": maps.target,
                          "shapes": shapes}, ensure_ascii=False), flush=True)
    return 0


# -- lmforge embed ----------------------------------------------------------------------------------------
def run_embed(args: argparse.Namespace) -> int:
    import numpy as np

    from lmforge.outputs import claim_file
    from lmforge.workflows.embed import analogy, embed, most_similar, rank_texts, text_analogy

    opts: EmbedOptions = args.settings["embed"]
    writes = args.out is not None and args.similar is None and args.analogy is None and args.query is None
    if writes and Path(args.out).suffix not in (".npy", ".jsonl", ".json"):
        raise LmforgeError(f"--out: {args.out} must end in .npy or .jsonl")
    if writes:
        claim_file(args.out, args.overwrite)  # before the model is loaded
    model, tokenizer = _load(args)
    if args.similar is not None:
        for token, cos in most_similar(model, tokenizer, args.similar, opts.k, subwords=opts.subwords):
            print(json.dumps({"token": token, "cosine": round(cos, 4)}, ensure_ascii=False))
        return 0
    if args.analogy is not None and args.text:  # over the TEXT arguments' contextual embeddings
        a, b, c = args.analogy
        found = text_analogy(model, tokenizer, a, b, c, args.text, opts.k, layer=opts.layer, mix=opts.mix,
                             mix_weights=opts.mix_weights, gamma=opts.gamma, pooling=opts.pooling,
                             exclude_special=opts.exclude_special, batch_size=opts.batch_size)
        for text, cos in found:
            print(json.dumps({"text": text, "cosine": round(cos, 4)}, ensure_ascii=False))
        return 0
    if args.analogy is not None:
        a, b, c = args.analogy
        for token, cos in analogy(model, tokenizer, a, b, c, opts.k, subwords=opts.subwords):
            print(json.dumps({"token": token, "cosine": round(cos, 4)}, ensure_ascii=False))
        return 0
    texts = list(input_lines(args.text, skip_blank=True, errors=args.settings["input"].errors))
    if not texts:
        raise LmforgeError("TEXT: no text given (arguments or standard input)")
    options = dict(layer=opts.layer, mix=opts.mix, mix_weights=opts.mix_weights, gamma=opts.gamma,
                   pooling=opts.pooling, exclude_special=opts.exclude_special, batch_size=opts.batch_size)
    if args.query is not None:
        vectors = embed(model, tokenizer, [args.query, *texts], **options)  # (1 + N, D)
        for row, cos in rank_texts(vectors[0], vectors[1:], opts.k):
            print(json.dumps({"text": texts[row], "cosine": round(cos, 4)}, ensure_ascii=False))
        return 0
    vectors = embed(model, tokenizer, texts, **options)  # (N, D)
    if args.out is None:
        for text, v in zip(texts, vectors, strict=True):
            print(json.dumps({"text": text, "embedding": [round(float(x), 6) for x in v]}, ensure_ascii=False))
        return 0
    out = Path(args.out)
    from lmforge.files import atomic_path, write_text_atomic

    if out.suffix == ".npy":
        with atomic_path(out) as tmp, open(tmp, "wb") as f:  # atomic: np.save would add .npy to a bare name
            np.save(f, vectors)
    else:
        write_text_atomic(out, "".join(json.dumps({"text": text, "embedding": [float(x) for x in v]},
                                                  ensure_ascii=False) + "\n"
                                       for text, v in zip(texts, vectors, strict=True)))
    where = "mix" if opts.mix else ("last" if opts.layer is None else opts.layer)
    print(json.dumps({"out": str(out), "shape": list(vectors.shape), "layer": where, "pooling": opts.pooling}))
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("attention", help="attention heatmaps (PNG) or the HTML attention explorer of a text",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory (lmforge or Hugging Face)")
    p.add_argument("--text", metavar="TEXT", help="the text (default: one text per line of standard input)")
    p.add_argument("--out", metavar="FILE", required=True,
                   help="FILE.png (heatmaps) or FILE.html (explorer); several texts give FILE-1, FILE-2, ...")
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)
    p.add_argument("--target", metavar="TEXT",
                   help="encoder-decoder: the decoder's text (default: the model's own greedy output)")
    add_settings(p, ATTENTION)
    add_quiet(p)
    p.set_defaults(handler=run_attention)

    p = sub.add_parser("embed", help="sentence embeddings (.npy / JSON lines); similar words and analogies",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory (lmforge or Hugging Face)")
    p.add_argument("--out", metavar="FILE", help="FILE.npy (N, D) or FILE.jsonl; default: JSON lines on stdout")
    p.add_argument("--overwrite", action="store_true", help=FILE_OVERWRITE_HELP)
    p.add_argument("--query", metavar="TEXT", help="rank the texts by cosine to this one instead")
    p.add_argument("--similar", metavar="WORD", help="nearest vocabulary entries to WORD's input embedding")
    p.add_argument("--analogy", nargs=3, metavar=("A", "B", "C"),
                   help="A is to B as C is to ?: B - A + C over input embeddings (words), or with TEXT arguments "
                   "over their sentence embeddings")
    add_settings(p, EMBED)
    add_quiet(p)
    p.add_argument("text", nargs="*", metavar="TEXT")
    p.set_defaults(handler=run_embed)
