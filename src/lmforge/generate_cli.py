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
standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator


def read_prompts(args: argparse.Namespace) -> Iterator[str]:
    if args.prompt is not None:
        yield args.prompt
        return
    for line in sys.stdin:
        yield line.rstrip("\n")


class TextStream:
    """Decode a growing list of ids and print only the new text (held back while a character is split).

    Byte-level BPE can cut a UTF-8 character across two tokens; its first half decodes to U+FFFD,
    so text ending in U+FFFD waits for the next token.
    """

    def __init__(self, tokenizer, out=None) -> None:
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids: list[int] = []
        self.printed = ""

    def add(self, token: int) -> None:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if not text.endswith("\ufffd") and text.startswith(self.printed):
            self.out.write(text[len(self.printed):])
            self.out.flush()
            self.printed = text

    def close(self) -> None:
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        rest = text[len(self.printed):] if text.startswith(self.printed) else ""
        self.out.write(rest + "\n")
        self.out.flush()


def run_generate(args: argparse.Namespace) -> int:
    import torch

    from lmforge import load
    from lmforge.errors import LmforgeError
    from lmforge.generate import generate, pad_prompts, stream

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, device=args.device)
    if tokenizer is None:
        raise LmforgeError(f"--model: {args.model} has no tokenizer file (tokenizer.json)")
    if not (hasattr(model, "decode") or type(model).__name__ == "Decoder"):  # an encoder cannot generate
        raise LmforgeError(f"--model: {args.model} holds a {type(model).__name__}, which does not generate text")
    config = model.config
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed)
    device = next(model.parameters()).device
    total_tokens, start = 0, time.perf_counter()

    seq2seq = hasattr(model, "decode")

    def prompt_ids(prompt: str) -> list[int]:
        # A decoder's prompt is continued, so no template tokens (an [EOS] at its end would end it); an
        # encoder-decoder's source is encoded as in training (lmforge.translate.source_ids).
        if seq2seq:  # a source, tokenized as the training pairs were
            from lmforge.translate import source_ids

            ids = source_ids(tokenizer, prompt)
        else:
            ids = tokenizer.encode(prompt, add_special_tokens=False).ids
        if not ids and config.bos_id is not None:
            ids = [config.bos_id]
        if not ids:
            raise LmforgeError("--prompt: the prompt is empty and the model has no bos_id to start from")
        return ids

    if args.json:  # batches of prompts, left-padded, one JSON object per prompt
        prompts = list(read_prompts(args))
        for first in range(0, len(prompts), args.batch_size):
            chunk = prompts[first:first + args.batch_size]
            ids, mask = pad_prompts([prompt_ids(p) for p in chunk], config.pad_id or 0, device)
            out = generate(model, ids, mask, beams=args.beams, length_penalty=args.length_penalty, **options)
            for prompt, new in zip(chunk, out.to_lists(), strict=True):
                stopped = bool(new) and new[-1] == config.eos_id
                print(json.dumps({"prompt": prompt, "text": tokenizer.decode(new, skip_special_tokens=True),
                                  "ids": new, "new_tokens": len(new), "stopped": stopped}, ensure_ascii=False),
                      flush=True)
                total_tokens += len(new)
    for prompt in [] if args.json else read_prompts(args):
        input_ids = torch.tensor([prompt_ids(prompt)], device=device)
        if args.beams > 1:  # the best hypothesis is known only at the end
            out = generate(model, input_ids, beams=args.beams, length_penalty=args.length_penalty, **options)
            new = out.to_lists()[0]
            print(tokenizer.decode(new, skip_special_tokens=True), flush=True)
        else:
            text_stream = TextStream(tokenizer)
            new = []
            for tokens in stream(model, input_ids, **options):
                new.append(int(tokens[0]))
                text_stream.add(new[-1])
            text_stream.close()
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
    p.add_argument("--max-new-tokens", type=int, default=50, metavar="N", help="most tokens to add (default 50)")
    p.add_argument("--temperature", type=float, default=0.0, metavar="T",
                   help="0 = greedy (default); > 0 samples from softmax(logits / T)")
    p.add_argument("--top-k", type=int, metavar="K", help="sample among the K most likely tokens only")
    p.add_argument("--top-p", type=float, metavar="P", help="sample among the smallest set with probability >= P")
    p.add_argument("--beams", type=int, default=1, metavar="B", help="beam search with B beams (default 1: off)")
    p.add_argument("--length-penalty", type=float, default=1.0, metavar="L",
                   help="beam score = log p / length**L (default 1.0)")
    p.add_argument("--seed", type=int, metavar="S", help="random seed: the same seed gives the same sample")
    p.add_argument("--json", action="store_true", help="one JSON object per prompt instead of streamed text")
    p.add_argument("--batch-size", type=int, default=8, metavar="N",
                   help="with --json: prompts generated together, left-padded (default 8)")
    p.add_argument("--device", default=None, help="cpu (default), cuda, ...")
    p.add_argument("--threads", type=int, default=0, metavar="N", help="torch CPU threads (default: torch's)")
    p.set_defaults(handler=run_generate)
