"""``lmforge chat``: talk to a chat model: its own template, streamed replies, the history kept.

    lmforge chat --model $(python -m lmforge.data.sources path smollm2)
    you> What is the capital of France? Answer in one sentence.
    The capital of France is Paris.

In a terminal: /reset forgets the conversation, /system TEXT sets the system message (and resets), /exit ends;
Ctrl-C stops a reply (what was shown of it stays in the conversation), Ctrl-C or Ctrl-D at the prompt ends.
Without a terminal: one conversation per line of standard input, ``{"messages": [...]}`` (the last one a user
turn), one answer per line on standard output: ``{"reply": ..., "finish_reason": "stop" | "length", "tokens": N}``.
Greedy by default; the sampling flags are those of ``lmforge generate``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from lmforge.cli.common import Settings, add_quiet, add_settings, load_options
from lmforge.generation.options import GenerateOptions
from lmforge.schema import Recipe
from lmforge.workflows.options import ChatOptions, Runtime, TemplateOptions, Weights

SETTINGS = Settings(Recipe({"generate": GenerateOptions, "chat": ChatOptions, "template": TemplateOptions,
                            "runtime": Runtime, "weights": Weights}),
                    flags=("generate", "chat", "template", "runtime", "weights"),
                    defaults={"generate.max_new_tokens": 256},
                    exclude=("generate.beams", "generate.length_penalty", "generate.batch_size"))


def run_chat(args: argparse.Namespace) -> int:
    from lmforge import load
    from lmforge.errors import LmforgeError
    from lmforge.workflows.chat import ChatFormat, chat_lm, read_conversation, reply

    options = args.settings["generate"]
    model, tokenizer = load(args.model, **load_options(args))
    if tokenizer is None:
        raise LmforgeError(f"--model: {args.model} has no tokenizer")
    fmt = ChatFormat(tokenizer, args.model, args.settings["template"].limits())
    lm = chat_lm(model, fmt, options)
    if not sys.stdin.isatty():  # one conversation per JSON line, one answer per line
        for n, line in enumerate(sys.stdin, 1):
            if not line.strip():
                continue
            said = list(reply(lm, read_conversation(line, f"<stdin> line {n}"), options))
            reason = "stop" if said and said[-1][0] in fmt.stop_ids else "length"
            print(json.dumps({"reply": "".join(t for _, t in said), "finish_reason": reason, "tokens": len(said)},
                             ensure_ascii=False), flush=True)
        return 0
    return talk(lm, options, args.settings["chat"].system)


def talk(lm: Any, options: GenerateOptions, system: str | None, ask: Callable[[str], str] | None = None) -> int:
    """The terminal conversation: read a line (``ask``, default ``input``), stream the reply, keep the history.
    Ctrl-C during a reply stops it (the part shown is kept as the assistant's turn) and asks again; Ctrl-C or
    Ctrl-D at the prompt, or /exit, ends the session."""
    from lmforge.errors import LmforgeError

    ask = ask or input
    history = [{"role": "system", "content": system}] if system else []
    print("lmforge chat: /reset, /system TEXT, /exit (Ctrl-D); Ctrl-C stops a reply", file=sys.stderr)
    while True:
        try:
            text = ask("you> ")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if text.strip() in ("/exit", "/quit"):
            return 0
        if text.strip() == "/reset" or text.startswith("/system "):
            system = text.removeprefix("/system ").strip() if text.startswith("/system ") else system
            history = [{"role": "system", "content": system}] if system else []
            print("(new conversation)", file=sys.stderr)
            continue
        if not text.strip():
            continue
        history.append({"role": "user", "content": text})
        try:
            said = stream_reply(lm, history, options)
        except LmforgeError as err:
            history.pop()
            print(f"lmforge: error: {err}", file=sys.stderr)
            continue
        if said is None:  # stopped before a word: as if the question was not asked
            history.pop()
            continue
        history.append({"role": "assistant", "content": said})


def stream_reply(lm: Any, history: list[dict[str, str]], options: GenerateOptions) -> str | None:
    """Print the reply as it comes; its text, or what was shown of it when Ctrl-C stopped it (None if nothing)."""
    from lmforge.workflows.chat import reply

    shown = ""
    try:
        for _, text in reply(lm, history, options):
            print(text, end="", flush=True)
            shown += text
    except KeyboardInterrupt:
        print(flush=True)
        print("(stopped)", file=sys.stderr)
        return shown or None
    print(flush=True)
    return shown


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="talk to a chat model (its template, streamed, history kept)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", metavar="DIR", required=True, help="model directory or .gguf file")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_chat)
