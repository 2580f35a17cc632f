"""Chat templates: a conversation -> the text a chat model was trained on, by the model's own Jinja template.

An instruct model learnt one layout of conversations. SmolLM2's (ChatML) reads::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is the capital of France?<|im_end|>
    <|im_start|>assistant
                                                  <- add_generation_prompt: the model writes from here

The layout travels with the model as a Jinja template (GGUF metadata, ``tokenizer_config.json`` or
``chat_template.jinja``). A template is code from a file: it is rendered in Jinja2's *sandbox*, which refuses
attribute access to Python internals (``__class__``, ``__globals__``...), so a template cannot run code; only the
helpers chat templates use are given (``raise_exception``, ``tojson``, ``strftime_now``, ``namespace``), as
``transformers`` gives them, so the text is byte-identical to its ``apply_chat_template``.

    >>> chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}"
    >>> ChatTemplate(chatml).render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n'

``assistant_spans`` finds, in the rendered text, each assistant reply and its end-of-turn marker: the only
characters instruction tuning puts a loss on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError

ROLES = ("system", "user", "assistant", "tool")
Message = dict[str, Any]


def check_messages(messages: Sequence[Message], where: str = "messages") -> list[Message]:
    """A conversation as templates expect it: a list of {"role", "content"} with known roles, string content.

    >>> check_messages([{"role": "robot", "content": "x"}])
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: messages[0].role: 'robot' is not one of system, user, assistant, tool
    """
    if not isinstance(messages, list | tuple) or not messages:
        raise LmforgeError(f"{where}: expected a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise LmforgeError(f"{where}[{i}]: a message is an object with 'role' and 'content'")
        if m["role"] not in ROLES:
            raise LmforgeError(f"{where}[{i}].role: {m['role']!r} is not one of {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise LmforgeError(f"{where}[{i}].content: expected a string, got {type(m['content']).__name__}")
        out.append(dict(m))
    return out


def messages_line(line: str, where: str, expected: str = 'an object with "messages"',
                  adapt: Any = None) -> dict[str, Any]:
    """One JSON line holding a conversation (``lmforge chat``'s input, training conversations, evaluation items):
    the object, its ``messages`` checked. ``adapt`` may rewrite the parsed value first (prompt/completion rows);
    anything else is one line naming ``where``.

    >>> messages_line('{"messages": [{"role": "user", "content": "hi"}], "answer": "a"}', "f:1")["answer"]
    'a'
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise LmforgeError(f"{where}: not JSON ({err.msg}); expected {expected}") from None
    row = adapt(row) if adapt is not None else row
    if not isinstance(row, dict) or "messages" not in row:
        raise LmforgeError(f"{where}: expected {expected}")
    row["messages"] = check_messages(row["messages"], f"{where}: messages")
    return row


class ChatTemplate:
    """A model's chat template, compiled once in Jinja2's sandbox.

    tokens: the special tokens templates may name (``bos_token``, ``eos_token``, ...).
    """

    def __init__(self, source: str, tokens: dict[str, str | None] | None = None) -> None:
        import jinja2
        import jinja2.utils
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.source = source
        self.tokens = {k: v for k, v in (tokens or {}).items() if v is not None}
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = to_json
        env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=jinja2.utils.Namespace)
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise LmforgeError(f"chat template: syntax error at line {err.lineno}: {err.message}") from None

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False, **extra: Any) -> str:
        """The conversation as text; ``add_generation_prompt`` appends the header of the assistant's turn."""
        import jinja2

        chat = check_messages(messages)
        try:
            return self.template.render(messages=chat, add_generation_prompt=add_generation_prompt, tools=None,
                                        documents=None, **self.tokens, **extra)
        except jinja2.TemplateError as err:  # raise_exception(...) in the template, an undefined name, ...
            raise LmforgeError(f"chat template: {err}") from None
        except (TypeError, ValueError, KeyError, AttributeError) as err:
            raise LmforgeError(f"chat template: could not render the conversation ({err})") from None

    def assistant_spans(self, messages: Sequence[Message]) -> list[tuple[int, int]]:
        """(start, end) character spans of each assistant message's content and its end-of-turn marker.

        The text between the conversation up to a turn rendered *with* the generation prompt and the
        conversation including that turn is what the assistant writes: its content and whatever the template
        closes the turn with (``<|im_end|>``). The newline some templates add after the marker is left out, as
        the model stops at the marker. The prefixes must render as prefixes of the whole text (true of every
        template that writes turns in order); one that does not is refused.
        """
        chat = check_messages(messages)
        full = self.render(chat)
        spans = []
        for i, m in enumerate(chat):
            if m["role"] != "assistant":
                continue
            before = self.render(chat[:i], add_generation_prompt=True) if i else ""
            through = self.render(chat[: i + 1])
            if not full.startswith(before) or not full.startswith(through) or not through.startswith(before):
                raise LmforgeError(f"chat template: turn {i} does not render as a prefix of the whole "
                                   "conversation, so the assistant's tokens cannot be located")
            start, end = len(before), len(through.rstrip("\n"))
            spans.append((start, max(end, start)))
        return spans


def to_json(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    """Jinja's ``tojson`` as chat templates expect it: plain JSON, no HTML escaping."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def read_chat_template(folder: str | Path) -> str | None:
    """A model directory's chat template: ``chat_template.jinja``, else ``tokenizer_config.json``'s
    ``chat_template`` (a string, or a list of named templates of which "default" is taken)."""
    from lmforge.files import read_text_utf8

    folder = Path(folder)
    if (folder / "chat_template.jinja").is_file():
        return read_text_utf8(folder / "chat_template.jinja", "chat template")
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        value = json.loads(read_text_utf8(config, "tokenizer config")).get("chat_template")
    except json.JSONDecodeError as err:
        raise LmforgeError(f"{config}: not valid JSON ({err.msg})") from None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None
