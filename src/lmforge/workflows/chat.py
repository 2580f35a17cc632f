"""A conversation with a chat model: its template renders the history, the engine writes the reply, the
template's end-of-turn token ends it. Used by ``lmforge chat``, ``generate --chat`` and the server.

    >>> model, tok = lmforge.load("SmolLM2-135M-Instruct.Q4_1.gguf")                       # doctest: +SKIP
    >>> chat(model, tok, [{"role": "user", "content": "What is the capital of France?"}])  # doctest: +SKIP
    'The capital of France is Paris.'

``ChatFormat`` is the model side: the rendered prompt's ids (``prompt_ids``: the template's markers are special
tokens, the messages' text is plain text, so a user's ``<|im_end|>`` forges nothing) and the tokens that end the
assistant's turn (``stop_ids``: the template's end-of-turn marker, e.g. ``<|im_end|>``, and the model's eos).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.tokenizers.chat import ChatTemplate, Message, check_messages, messages_line
from lmforge.tokenizers.sandbox import RenderLimits


class ChatFormat:
    """A tokenizer with a chat template: conversations -> prompt ids, and the ids that end a reply.

    name: what errors call the template ("chat template of NAME: ..."; the model's folder or file);
    limits: the budget of each render (``tokenizers.sandbox.RenderLimits``; ``TemplateOptions.limits()``).
    """

    def __init__(self, tokenizer: Any, context: int | None = None, name: str | None = None,
                 limits: RenderLimits | None = None) -> None:
        if not tokenizer.chat_template:
            raise LmforgeError("the model has no chat template (tokenizer_config.json's chat_template, "
                               "chat_template.jinja, or a GGUF's tokenizer.chat_template)")
        self.tokenizer, self.context = tokenizer, context
        self.template = ChatTemplate.for_tokenizer(tokenizer, name, limits)
        self.stop_ids = self.end_of_turn()

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The conversation's text (as transformers renders it); its ids are ``conversation_ids``, not
        ``encode(render(...))``, which would read special-token strings in messages as special tokens."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Trusted text (the template's own, a task file's) -> ids: special-token strings become their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False, allow_special=True).ids

    def conversation_ids(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> list[int]:
        """The conversation's ids: the template's markers are special tokens, the messages' text plain text."""
        return self.template.encode(self.tokenizer, messages, add_generation_prompt).ids

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]:
        """The conversation so far, ready for the assistant's reply; one line when it cannot be served."""
        messages = check_messages(messages)
        if messages[-1]["role"] == "assistant":
            raise LmforgeError("messages: the last message is the assistant's; end with a user turn to get a reply")
        ids = self.conversation_ids(messages)
        if self.context is not None and len(ids) >= self.context:
            raise LmforgeError(f"messages: the conversation is {len(ids)} tokens, the model's context "
                               f"{self.context}: shorten it (or /reset)")
        return ids

    def end_of_turn(self) -> list[int]:
        """The special tokens the template writes right after an assistant's content (``<|im_end|>``), and eos."""
        probe = "lmforge-probe"
        text = self.render([{"role": "user", "content": "x"}, {"role": "assistant", "content": probe}], False)
        after = text[text.index(probe) + len(probe):] if probe in text else ""
        ids = self.encode(after)[:1]
        stops = [i for i in ids if i in self.tokenizer.special_ids]
        eos = self.tokenizer.eos_id
        return sorted({*stops, *([eos] if eos is not None else [])})

    def reply_text(self, ids: Sequence[int]) -> str:
        """A reply's text: without its end-of-turn token and other special tokens."""
        return self.tokenizer.decode([i for i in ids if i not in self.stop_ids], skip_special_tokens=True)


def chat_format(folder: str | Path, tokenizer: Any, model: Any,
                limits: RenderLimits | None = None) -> ChatFormat | None:
    """The model's ChatFormat, or None when it has no chat template (the server then serves completions only)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    return ChatFormat(tokenizer, getattr(model.config, "max_positions", None), str(folder), limits)


def reply(model: Any, fmt: ChatFormat, messages: Sequence[Message], options: Any = None) -> Iterator[int]:
    """The assistant's next reply, token by token (its end-of-turn token included), by ``options``
    (``generation.options.GenerateOptions``: greedy by default)."""
    import torch

    from lmforge.generation import stream
    from lmforge.generation.options import GenerateOptions
    from lmforge.models.interfaces import special_ids

    options = options or GenerateOptions(max_new_tokens=256)
    stops = special_ids(model, fmt.tokenizer).ending(fmt.stop_ids)  # the server's stops for a chat reply
    ids = fmt.prompt_ids(messages)
    settings = options.sampling()
    room = model.config.max_positions - len(ids)
    settings["max_new_tokens"] = min(settings["max_new_tokens"], room)
    settings["stop_strings"] = settings["stop_strings"] or None
    device = next(model.parameters()).device
    for tokens in stream(model, torch.tensor([ids], device=device), stop_ids=stops, tokenizer=fmt.tokenizer,
                         **settings):
        token = int(tokens[0])
        yield token
        if token in stops:
            return


def chat(model: Any, tokenizer: Any, messages: Sequence[Message], options: Any = None) -> str:
    """The assistant's reply to ``messages`` as text (greedy unless ``options`` say otherwise)."""
    fmt = ChatFormat(tokenizer, getattr(model.config, "max_positions", None))
    return fmt.reply_text(list(reply(model, fmt, messages, options)))


def read_conversation(line: str, where: str) -> list[Message]:
    """One JSON line of ``lmforge chat`` without a terminal: ``{"messages": [...]}``."""
    return messages_line(line, where, '{"messages": [...]}')["messages"]
