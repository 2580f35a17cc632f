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

from lmforge.cli.common import Settings, add_quiet, add_settings, input_lines, load_options
from lmforge.generation.options import GenerateOptions
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime, TextInput, Weights

SETTINGS = Settings(Recipe({"generate": GenerateOptions, "input": TextInput, "runtime": Runtime, "weights": Weights}),
                    flags=("generate", "input", "runtime", "weights"))


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from lmforge import load
    from lmforge.errors import LmforgeError
    from lmforge.generation import generate, pad_prompts, stream
    from lmforge.generation.text import TextStream, cut_at_stop, fit_window, prompt_ids
    from lmforge.models.interfaces import generates_text, is_encoder_decoder, special_ids

    opts: GenerateOptions = args.settings["generate"]
    model, tokenizer = load(args.model, **load_options(args))
    if tokenizer is None:
        raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
    if not generates_text(model):  # an encoder cannot generate
        raise LmforgeError(f"--model: {args.model}: a {type(model).__name__} model does not generate text "
                           "(it is neither a decoder nor an encoder-decoder)")
    config = model.config
    if args.chat is not None:  # one question through the model's chat template; the reply streams
        from lmforge.workflows.chat import ChatFormat, chat_lm, reply

        fmt = ChatFormat(tokenizer, args.model)
        for _, text in reply(chat_lm(model, fmt, opts), [{"role": "user", "content": args.chat}], opts):
            print(text, end="", flush=True)
        print(flush=True)
        return 0
    if opts.temperature == 0 and (opts.top_k or opts.top_p):
        print("lmforge generate: --temperature 0 is greedy decoding: --top-k / --top-p have no effect",
              file=sys.stderr)
    special = special_ids(model, tokenizer)
    options = {**opts.sampling(), "tokenizer": tokenizer, "stop_ids": list(special.stops)}
    device = next(model.parameters()).device
    total_tokens, start = 0, time.perf_counter()
    prompts = [args.prompt] if args.prompt is not None else input_lines(None, errors=args.settings["input"].errors)
    if args.json:  # batches of prompts, left-padded, one JSON object per prompt
        prompts = list(prompts)
        for first in range(0, len(prompts), opts.batch_size):
            chunk = prompts[first:first + opts.batch_size]
            encoded = [prompt_ids(model, tokenizer, p) for p in chunk]
            if not is_encoder_decoder(model):  # each row's window holds its prompt + the new tokens
                fitted = [fit_window(ids, opts.max_new_tokens, config.max_positions) for ids in encoded]
                encoded, options["max_new_tokens"] = [f[0] for f in fitted], fitted[0][1]
                for n, (*_, note) in enumerate(fitted, first + 1):
                    if note:
                        print(f"lmforge generate: prompt {n}: {note}", file=sys.stderr)
            ids, mask = pad_prompts(encoded, special.pad, device)
            out = generate(model, ids, mask, beams=opts.beams, length_penalty=opts.length_penalty, **options)
            for prompt, new in zip(chunk, out.to_lists(), strict=True):
                text = tokenizer.decode(new, skip_special_tokens=True)
                cut = cut_at_stop(text, opts.stop or [])
                by_string = cut != text or any(map(cut.endswith, opts.stop or []))
                stopped = (bool(new) and new[-1] in special.stops) or by_string
                print(json.dumps({"prompt": prompt, "text": cut,
                                  "ids": new, "new_tokens": len(new), "stopped": stopped}, ensure_ascii=False),
                      flush=True)
                total_tokens += len(new)
        prompts = []
    for prompt in prompts:
        ids, n_new = prompt_ids(model, tokenizer, prompt), opts.max_new_tokens
        if not is_encoder_decoder(model):  # a decoder's window holds prompt + new tokens: keep the prompt's tail
            ids, n_new, note = fit_window(ids, n_new, config.max_positions)
            if note:
                print(f"lmforge generate: {note}", file=sys.stderr)
        options["max_new_tokens"] = n_new
        input_ids = torch.tensor([ids], device=device)
        if opts.beams > 1:  # the best hypothesis is known only at the end
            out = generate(model, input_ids, beams=opts.beams, length_penalty=opts.length_penalty, **options)
            new = out.to_lists()[0]
            print(cut_at_stop(tokenizer.decode(new, skip_special_tokens=True), opts.stop or []), flush=True)
        else:
            text_stream = TextStream(tokenizer, stops=opts.stop or [])
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
    p.add_argument("--chat", metavar="TEXT", help="a question to a chat model, through its chat template")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt instead of streamed text")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_generate)
