"""A conversation with a chat model: its template renders the history, the engine writes the reply, the
template's end-of-turn token ends it. Used by ``lmforge chat``, ``generate --chat`` and the server.

    >>> model, tok = lmforge.load("SmolLM2-135M-Instruct.Q4_1.gguf")                       # doctest: +SKIP
    >>> chat(model, tok, [{"role": "user", "content": "What is the capital of France?"}])  # doctest: +SKIP
    'The capital of France is Paris.'

``ChatFormat`` (tokenizers/chat.py, the same object training uses) is the model side: the rendered prompt's ids
and the tokens that end the assistant's turn; ``LM`` (generation/lm.py) writes the reply.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lmforge.tokenizers.chat import ChatFormat, Message, messages_line
from lmforge.tokenizers.sandbox import RenderLimits

__all__ = ["ChatFormat", "chat", "chat_format", "chat_lm", "read_conversation", "reply"]


def chat_format(folder: str | Path, tokenizer: Any, model: Any,
                limits: RenderLimits | None = None) -> ChatFormat | None:
    """The model's ChatFormat, or None when it has no chat template (the server then serves completions only)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    return ChatFormat(tokenizer, str(folder), limits)


def chat_lm(model: Any, fmt: ChatFormat, options: Any = None) -> Any:
    """The ``LM`` a conversation runs on (one per conversation: its engine is kept between turns)."""
    from lmforge.generation.lm import LM

    return LM(model, fmt.tokenizer, fmt, compile=getattr(options, "compile", None))


def reply(lm: Any, messages: Sequence[Message], options: Any = None) -> Iterator[tuple[int, str]]:
    """The assistant's next reply as it is written: (token, the text it adds), its end-of-turn token included,
    by ``options`` (``generation.options.GenerateOptions``: greedy by default)."""
    from lmforge.generation.options import GenerateOptions

    options = options or GenerateOptions(max_new_tokens=256)
    settings = {k: v for k, v in options.sampling().items() if k != "compile"}
    yield from lm.reply(messages, **settings)


def chat(model: Any, tokenizer: Any, messages: Sequence[Message], options: Any = None) -> str:
    """The assistant's reply to ``messages`` as text (greedy unless ``options`` say otherwise)."""
    fmt = ChatFormat(tokenizer)
    return "".join(text for _, text in reply(chat_lm(model, fmt, options), messages, options))


def read_conversation(line: str, where: str) -> list[Message]:
    """One JSON line of ``lmforge chat`` without a terminal: ``{"messages": [...]}``."""
    return messages_line(line, where, '{"messages": [...]}')["messages"]
