"""Chat templates: a conversation -> the text a chat model was trained on, by the model's own Jinja template.

An instruct model learnt one layout of conversations. SmolLM2's (ChatML) reads::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is the capital of France?<|im_end|>
    <|im_start|>assistant
                                                  <- add_generation_prompt: the model writes from here

The layout travels with the model as a Jinja template (GGUF metadata, ``tokenizer_config.json`` or
``chat_template.jinja``). A template is code from a file, so it is held three ways:

- it runs in Jinja2's immutable *sandbox*, which refuses attribute access to Python internals (``__class__``,
  ``__globals__``...): it cannot run code; only the helpers chat templates use are given (``raise_exception``,
  ``tojson``, ``strftime_now``, ``namespace``), as ``transformers`` gives them, so the text is byte-identical to
  its ``apply_chat_template``;
- each render has a budget of time, size and steps (``sandbox.py``), and whatever a template raises (its own
  ``raise_exception``, a budget reached, RecursionError, ZeroDivisionError, ...) is one ``LmforgeError`` line
  naming the template: "chat template of runs/x: ...";
- message text is text: special-token strings a user writes are encoded as plain text, only the template's own
  markers are special tokens (``plain_specials.py``; ``encode``).

    >>> chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\\n{{ m['content'] }}<|im_end|>\\n{% endfor %}"
    >>> ChatTemplate(chatml).render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n'

``assistant_spans`` finds, in the rendered text, each assistant reply and its end-of-turn marker: the only
characters instruction tuning puts a loss on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.tokenizers.encoding import Encoding
from lmforge.tokenizers.plain_specials import PlainSpecials
from lmforge.tokenizers.sandbox import BoundedEnvironment, RenderLimits, TemplateLimit, render_bounded

ROLES = ("system", "user", "assistant", "tool")
TEMPLATE_FILES = ("chat_template.jinja", "tokenizer_config.json")  # where a folder keeps its template; beside a
# checksums.json each must be listed in it (lmforge.tokenizers.load_tokenizer, interop.directories.verify_directory)
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


NO_SPECIALS = PlainSpecials(())  # hides only U+FDD0: a template made without a tokenizer
PLAIN: ContextVar[PlainSpecials | None] = ContextVar("lmforge_plain_specials", default=None)  # of the render


class ChatTemplate:
    """A model's chat template, compiled once in the bounded sandbox (``tokenizers/sandbox.py``).

    tokens: the special tokens templates may name (``bos_token``, ``eos_token``, ...); name: what error messages
    call the template ("chat template of runs/x"); limits: the budget of each render. ``uses_tools``: whether the
    template reads the ``tools`` variable (a tools section: it states a request's tools its own way). ``encode``
    keeps the special-token strings of the tokenizer it is given as plain text in message text (``PlainSpecials``).
    """

    def __init__(self, source: str, tokens: dict[str, str | None] | None = None, name: str | None = None,
                 limits: RenderLimits | None = None) -> None:
        import jinja2
        import jinja2.meta
        import jinja2.utils

        self.source, self.limits = source, limits or RenderLimits()
        self.where = f"chat template of {name}" if name else "chat template"
        self.tokens = {k: v for k, v in (tokens or {}).items() if v is not None}
        self.plains = {(): NO_SPECIALS}  # by the special tokens of a tokenizer (``plain_for``)
        self.plain = NO_SPECIALS  # what ``render`` hides by default: the tokenizer's, once ``for_tokenizer`` made it
        env = BoundedEnvironment(filters={"tojson": self.to_json},
                                 globals={"raise_exception": raise_exception, "strftime_now": strftime_now,
                                          "namespace": jinja2.utils.Namespace},
                                 trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        try:
            self.template = env.compile_bounded(source)
            self.uses_tools = "tools" in jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as err:
            raise LmforgeError(f"{self.where}: syntax error at line {err.lineno}: {err.message}") from None
        except Exception as err:  # a template file is untrusted input: whatever it does is one line
            raise self.failure(err) from None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, name: str | None = None,
                      limits: RenderLimits | None = None) -> ChatTemplate:
        """The template of ``tokenizer.chat_template``, given the tokenizer's role tokens (``bos_token``, ...,
        as transformers gives its special tokens map)."""
        roles = {f"{role}_token": token for role, token in tokenizer.roles.items()}
        template = cls(tokenizer.chat_template, roles, name, limits)
        template.plain = template.plain_for(tokenizer)
        return template

    def plain_for(self, tokenizer: Any) -> PlainSpecials:
        """The ``PlainSpecials`` of ``tokenizer``'s special tokens (built once per set of tokens)."""
        key = tuple(tokenizer.special_tokens)
        if key not in self.plains:
            if len(self.plains) > 8:
                self.plains = {(): NO_SPECIALS}
            self.plains[key] = PlainSpecials(key)
        return self.plains[key]

    def render_marked(self, messages: Sequence[Message], add_generation_prompt: bool = False,
                      plain: PlainSpecials | None = None, **extra: Any) -> str:
        """The conversation rendered with the special-token strings of its messages (and of ``extra``) hidden
        behind ``plain``'s markers: what ``encode`` reads."""
        chat, plain = check_messages(messages), plain or self.plain
        token = PLAIN.set(plain)
        try:
            context = {"messages": [plain.hide_all(m) for m in chat], "add_generation_prompt": add_generation_prompt,
                       "tools": None, "documents": None, **self.tokens}
            context.update(plain.hide_all(extra))
            return render_bounded(self.template, context, self.limits)
        except Exception as err:  # a template is untrusted code: whatever it raises is one line
            raise self.failure(err) from None
        finally:
            PLAIN.reset(token)

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = False, tokenizer: Any = None,
               **extra: Any) -> str:
        """The conversation as text (``add_generation_prompt`` appends the header of the assistant's turn):
        byte-identical to transformers' ``apply_chat_template(..., tokenize=False)``. It is the text of
        ``encode(tokenizer, ...)`` (default: the tokenizer the template was made for), whose markers a template
        sees as two characters each: one that slices or measures message text holding special-token strings
        sees them shorter than transformers' would."""
        plain = self.plain_for(tokenizer) if tokenizer is not None else self.plain
        return plain.show(self.render_marked(messages, add_generation_prompt, plain, **extra))

    def encode(self, tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool = False,
               **extra: Any) -> Encoding:
        """The conversation's tokens: the template's own special tokens are ids, every message's text is plain
        text (a user's ``<|im_end|>`` is the tokens of those ten characters). Offsets index ``render()``'s text.
        For text without special-token strings the ids are those of ``tokenizer.encode(render(...),
        allow_special=True)``: transformers' ``apply_chat_template(..., tokenize=True)``."""
        plain = self.plain_for(tokenizer)
        return plain.encode(tokenizer, self.render_marked(messages, add_generation_prompt, plain, **extra))

    def failure(self, err: BaseException) -> LmforgeError:
        """Whatever a template raised, as one line naming the template (and the line of the template)."""
        import jinja2

        if isinstance(err, TemplateLimit | jinja2.TemplateError):
            what = str(err)
        elif isinstance(err, RecursionError):
            what = "recursion too deep (a macro or loop that calls itself without end)"
        elif isinstance(err, MemoryError):
            what = "out of memory"
        else:
            what = f"could not render the conversation ({type(err).__name__}: {err})"
        what = " ".join(what.split())
        what = what if len(what) <= 300 else what[:297] + "..."
        line = template_line(err)
        return LmforgeError(f"{self.where}: {what}" + (f" (template line {line})" if line else ""))

    def to_json(self, value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
                sort_keys: bool = False) -> str:
        """Jinja's ``tojson`` as chat templates expect it (plain JSON, no HTML escaping); special-token strings
        of the data stay hidden (plain text), even when ``ensure_ascii`` writes them as \\u escapes."""
        if isinstance(indent, int) and indent > 16:
            raise TemplateLimit(f"tojson(indent={indent}): at most 16")
        plain = PLAIN.get() or NO_SPECIALS
        text = json.dumps(plain.show_all(value), ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)
        return plain.hide(text)

    def assistant_spans(self, messages: Sequence[Message], tokenizer: Any = None) -> list[tuple[int, int]]:
        """(start, end) character spans of each assistant message's content and its end-of-turn marker.

        The text between the conversation up to a turn rendered *with* the generation prompt and the
        conversation including that turn is what the assistant writes: its content and whatever the template
        closes the turn with (``<|im_end|>``). The newline some templates add after the marker is left out, as
        the model stops at the marker. The prefixes must render as prefixes of the whole text (true of every
        template that writes turns in order); one that does not is refused. The spans index ``render(messages,
        tokenizer=tokenizer)``: the text whose tokens ``encode(tokenizer, ...)`` gives, with their offsets.
        """
        chat = check_messages(messages)
        full = self.render(chat, tokenizer=tokenizer)
        spans = []
        for i, m in enumerate(chat):
            if m["role"] != "assistant":
                continue
            before = self.render(chat[:i], True, tokenizer) if i else ""
            through = self.render(chat[: i + 1], tokenizer=tokenizer)
            if not full.startswith(before) or not full.startswith(through) or not through.startswith(before):
                raise LmforgeError(f"{self.where}: turn {i} does not render as a prefix of the whole "
                                   "conversation, so the assistant's tokens cannot be located")
            start, end = len(before), len(through.rstrip("\n"))
            spans.append((start, max(end, start)))
        return spans


def template_line(err: BaseException) -> int | None:
    """The template line an error was raised at: Jinja rewrites tracebacks to frames of ``<template>``."""
    tb, line = err.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 200:
        raise TemplateLimit("strftime_now: the format is a string of at most 200 characters")
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


class ChatFormat:
    """A tokenizer with a chat template: conversations -> prompt ids, and the ids that end a reply. What serving,
    chat and evaluation encode conversations with; instruction tuning renders them with the same template, the
    same variables and the same encoding (``ChatTemplate.encode``: the template's markers are special tokens, the
    messages' text plain text, so a user's ``<|im_end|>`` forges nothing).

    name: what errors call the template ("chat template of NAME: ..."; the model's folder or file);
    limits: the budget of each render (``tokenizers.sandbox.RenderLimits``; ``TemplateOptions.limits()``).
    """

    def __init__(self, tokenizer: Any, name: str | None = None, limits: RenderLimits | None = None) -> None:
        if not tokenizer.chat_template:
            raise LmforgeError("the model has no chat template (tokenizer_config.json's chat_template, "
                               "chat_template.jinja, or a GGUF's tokenizer.chat_template)")
        self.tokenizer = tokenizer
        self.template = ChatTemplate.for_tokenizer(tokenizer, name, limits)
        self.stop_ids = self.end_of_turn()

    def render(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """The conversation's text (as transformers renders it); its ids are ``conversation_ids``, not
        ``encode(render(...))``, which would read special-token strings in messages as special tokens."""
        return self.template.render(messages, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        """Trusted text (the template's own, a task file's) -> ids: special-token strings become their ids."""
        return self.tokenizer.encode(text, add_special_tokens=False, allow_special=True).ids

    def conversation_ids(self, messages: Sequence[Message], add_generation_prompt: bool = True,
                         tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation's ids: the template's markers are special tokens, the messages' text plain text;
        ``tools`` (OpenAI's function objects) go to a template that has a tools section (``uses_tools``)."""
        return self.template.encode(self.tokenizer, messages, add_generation_prompt, tools=tools).ids

    def prompt_ids(self, messages: Sequence[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation so far, ready for the assistant's reply (whether it fits a context is the engine's
        check, ``generation.requests.check_room``)."""
        messages = check_messages(messages)
        if messages[-1]["role"] == "assistant":
            raise LmforgeError("messages: the last message is the assistant's; end with a user turn to get a reply")
        return self.conversation_ids(messages, tools=tools)

    @property
    def uses_tools(self) -> bool:
        return self.template.uses_tools

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
