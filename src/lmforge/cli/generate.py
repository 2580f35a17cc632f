"""``lmforge generate``: continue a prompt (GPT) or transform a source (encoder-decoder) from a model directory.

    lmforge generate --model DIR --prompt "Once upon a time" --max-new-tokens 50
    lmforge generate --model DIR --prompt "To be" --temperature 0.8 --top-p 0.95 --seed 0
    lmforge generate --model DIR --beams 4 --json < prompts.txt

Output. By default the generated text (the continuation, not the prompt) is written to standard output
as it is produced, one line per prompt, flushed after every token. With ``--json`` each prompt gives one
JSON object on its own line, once it is finished; prompts are then generated in left-padded batches of
``--batch-size`` (each row gives what its prompt gives alone; sampled rows draw from one shared stream):

    {"prompt": "To be", "text": " or not", "ids": [...], "new_tokens": 3, "stopped": true}

``--beams B`` > 1 (beam search) cannot stream, since the best hypothesis is known only at the end: the
whole text is printed at once. ``--temperature 0`` (the default) is greedy decoding. Timing goes to
standard error. ``--compile`` (the default on CUDA) decodes each token with one fixed-shape step compiled
by ``torch.compile`` (a CUDA graph on a GPU): the same tokens, after a first call that compiles.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from lmforge.cli.common import (
    add_common,
    add_input_errors,
    apply_runtime,
    input_lines,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    probability,
)


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from lmforge import load
    from lmforge.errors import LmforgeError
    from lmforge.generation import generate, pad_prompts, stream
    from lmforge.generation.text import TextStream, cut_at_stop, fit_window, prompt_ids
    from lmforge.models.interfaces import generates_text, is_encoder_decoder

    apply_runtime(args)
    model, tokenizer = load(args.model, device=args.device)
    if tokenizer is None:
        raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
    if not generates_text(model):  # an encoder cannot generate
        raise LmforgeError(f"--model: {args.model}: a {type(model).__name__} model does not generate text "
                           "(it is neither a decoder nor an encoder-decoder)")
    config = model.config
    if args.beams > 1 and (args.stop or args.repetition_penalty != 1.0):
        raise LmforgeError("--beams: beam search ends on stop tokens and takes no repetition penalty; "
                           "--stop and --repetition-penalty go with greedy decoding or sampling")
    temperature = args.temperature
    if temperature is None:  # top-k / top-p filter a distribution to sample from: they imply sampling
        temperature = 1.0 if (args.top_k or args.top_p) else 0.0
    elif temperature == 0 and (args.top_k or args.top_p):
        print("lmforge generate: --temperature 0 is greedy decoding: --top-k / --top-p have no effect",
              file=sys.stderr)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, compile=args.compile,
                   repetition_penalty=args.repetition_penalty, stop_strings=args.stop, tokenizer=tokenizer)
    device = next(model.parameters()).device
    total_tokens, start = 0, time.perf_counter()
    prompts = [args.prompt] if args.prompt is not None else input_lines(None, errors=args.errors)
    if args.json:  # batches of prompts, left-padded, one JSON object per prompt
        prompts = list(prompts)
        for first in range(0, len(prompts), args.batch_size):
            chunk = prompts[first:first + args.batch_size]
            encoded = [prompt_ids(model, tokenizer, p) for p in chunk]
            if not is_encoder_decoder(model):  # each row's window holds its prompt + the new tokens
                fitted = [fit_window(ids, args.max_new_tokens, config.max_positions) for ids in encoded]
                encoded, options["max_new_tokens"] = [f[0] for f in fitted], fitted[0][1]
                for n, (*_, note) in enumerate(fitted, first + 1):
                    if note:
                        print(f"lmforge generate: prompt {n}: {note}", file=sys.stderr)
            ids, mask = pad_prompts(encoded, config.pad_id or 0, device)
            out = generate(model, ids, mask, beams=args.beams, length_penalty=args.length_penalty, **options)
            for prompt, new in zip(chunk, out.to_lists(), strict=True):
                text = tokenizer.decode(new, skip_special_tokens=True)
                cut = cut_at_stop(text, args.stop or [])
                by_string = cut != text or any(map(cut.endswith, args.stop or []))
                stopped = (bool(new) and new[-1] == config.eos_id) or by_string
                print(json.dumps({"prompt": prompt, "text": cut,
                                  "ids": new, "new_tokens": len(new), "stopped": stopped}, ensure_ascii=False),
                      flush=True)
                total_tokens += len(new)
        prompts = []
    for prompt in prompts:
        ids, n_new = prompt_ids(model, tokenizer, prompt), args.max_new_tokens
        if not is_encoder_decoder(model):  # a decoder's window holds prompt + new tokens: keep the prompt's tail
            ids, n_new, note = fit_window(ids, n_new, config.max_positions)
            if note:
                print(f"lmforge generate: {note}", file=sys.stderr)
        options["max_new_tokens"] = n_new
        input_ids = torch.tensor([ids], device=device)
        if args.beams > 1:  # the best hypothesis is known only at the end
            out = generate(model, input_ids, beams=args.beams, length_penalty=args.length_penalty, **options)
            new = out.to_lists()[0]
            print(cut_at_stop(tokenizer.decode(new, skip_special_tokens=True), args.stop or []), flush=True)
        else:
            text_stream = TextStream(tokenizer, stops=args.stop or [])
            for tokens in stream(model, input_ids, **options):
                text_stream.add(int(tokens[0]))
            text_stream.close()
            new = text_stream.ids
        total_tokens += len(new)
    seconds = time.perf_counter() - start
    print(f"lmforge generate: {total_tokens} new tokens in {seconds:.2f} s "
          f"({total_tokens / max(seconds, 1e-9):.1f} tokens/s)", file=sys.stderr)
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text: greedy, sampling (temperature, top-k, top-p) or beams",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory (lmforge or Hugging Face GPT-2)")
    p.add_argument("--prompt", metavar="TEXT", help="the prompt (default: one prompt per line of standard input)")
    p.add_argument("--max-new-tokens", type=non_negative_int, default=50, metavar="N",
                   help="most tokens to add (default 50)")
    p.add_argument("--temperature", type=non_negative_float, metavar="T",
                   help="0 = greedy; > 0 samples from softmax(logits / T) (default 0, or 1 when --top-k or "
                   "--top-p is given)")
    p.add_argument("--top-k", type=positive_int, metavar="K", help="sample among the K most likely tokens only")
    p.add_argument("--top-p", type=probability, metavar="P", help="sample among the smallest set with probability >= P")
    p.add_argument("--beams", type=positive_int, default=1, metavar="B",
                   help="beam search with B beams (default 1: off)")
    p.add_argument("--length-penalty", type=float, default=1.0, metavar="L",
                   help="beam score = log p / length**L (default 1.0)")
    p.add_argument("--stop", action="append", metavar="STRING",
                   help="end the text once it holds STRING (kept; repeatable; not with --beams)")
    p.add_argument("--repetition-penalty", type=positive_float, default=1.0, metavar="R",
                   help="> 1 makes tokens already in the text less likely (CTRL; default 1: off)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed: the same seed gives the same sample")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="one compiled fixed-shape step per token (CUDA graphs on a GPU); default: on for CUDA")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt instead of streamed text")
    p.add_argument("--batch-size", type=positive_int, default=8, metavar="N",
                   help="with --json: prompts generated together, left-padded (default 8)")
    add_input_errors(p)
    add_common(p, device="cpu")
    p.set_defaults(handler=run_generate)
