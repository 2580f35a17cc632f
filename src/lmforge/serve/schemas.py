"""The request bodies of the OpenAI-shaped API, checked field by field (a bad one is a 400 naming the field).

Types are strict, as OpenAI's are: ``"max_tokens": "4"`` or ``true`` is refused, not read as 4 or 1 (a number
is accepted where a float is asked). Text fields refuse lone UTF-16 surrogates (``"\\ud800"``), which JSON can
spell but no UTF-8 text holds. Message content is a string or OpenAI's list of content parts, of which lmforge
reads the text parts (joined by a line break); an image or audio part is refused, naming it.

A field the OpenAI API would reject is refused (``extra="forbid"``). ``tools``, ``tool_choice`` and
``parallel_tool_calls`` are read by ``tools.py``, messages may carry ``tool_calls`` (the assistant's) and
``tool_call_id`` (a tool's result). lmforge adds ``top_k`` and ``repetition_penalty``, and two kinds of
``response_format``: ``{"type": "regex", "regex": "..."}`` and ``{"type": "choice", "choice": ["...", ...]}``.

The sampling fields' ranges are not written here: ``declared`` reads them from their declaration in
``generation.options.GenerateOptions`` (the flags' and ``generate``'s), with OpenAI's own where the field's ``api``
says so (temperature <= 2, max_tokens >= 1, at most 32 stop strings). Only the wire names and OpenAI's defaults
(temperature 1, top_p 1) are this module's.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from lmforge.errors import LmforgeError
from lmforge.generation.constraints import Constraint
from lmforge.generation.options import SETTINGS
from lmforge.schema import api_rules, check_range
from lmforge.serve.tools import MAX_TOOLS, Call, Tool, ToolChoice

TOP_LOGPROBS = 20  # alternatives a token's log-probability comes with, at most (OpenAI's chat: 20)
MAX_PROMPTS = 64  # prompts one completion request may hold (each a choice of the answer)
MAX_BIASED = 300  # tokens a logit_bias may name (OpenAI's limit)
MAX_CHOICES = 16  # n: choices one request may ask for
MAX_PATTERN = 10_000  # characters of a response_format regex
MAX_CHOICE_LIST = 1_000  # strings a response_format choice may list


def declared(name: str, default: Any) -> Any:
    """The pydantic field of the decoding setting ``name`` (a field of ``GenerateOptions``): its bounds as the HTTP
    API takes them (``schema.api_rules``), finite numbers only, its help as the description (the OpenAPI page)."""
    rules = api_rules(SETTINGS[name])
    return Field(default, ge=rules["min"], le=rules["max"], gt=rules["above"], lt=rules["below"],
                 allow_inf_nan=False, description=rules["help"])


def no_surrogates(text: str) -> str:
    """Text that UTF-8 can hold: a lone surrogate (JSON's ``"\\ud800"``) is refused (checked by the codec, in C:
    a megabyte of text costs a millisecond, not a Python loop holding the interpreter)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("holds a lone UTF-16 surrogate (not valid Unicode text)") from None
    return text


Text = Annotated[str, AfterValidator(no_surrogates)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class JsonSchema(Strict):
    """OpenAI's ``response_format.json_schema``: the reply is JSON valid against ``schema`` (always enforced:
    ``strict`` is accepted and changes nothing)."""

    name: Text = Field(max_length=64)
    description: Text | None = None
    schema_: dict[str, Any] | bool = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    """What the reply must be: free text, any JSON object, JSON valid against a schema, or (lmforge's) text
    matching a regular expression or one of a list of strings."""

    type: Literal["text", "json_object", "json_schema", "regex", "choice"]
    json_schema: JsonSchema | None = None
    regex: Text | None = Field(None, min_length=1, max_length=MAX_PATTERN)
    choice: list[Text] | None = Field(None, min_length=1, max_length=MAX_CHOICE_LIST)

    def constraint(self) -> Constraint | None:
        """The engine's constraint; the field a kind needs, missing or given to another kind, is one line."""
        given = {name for name in ("json_schema", "regex", "choice") if getattr(self, name) is not None}
        needed = {"json_schema", "regex", "choice"} & {self.type}
        for name in given - needed:
            raise LmforgeError(f"response_format.{name}: only with type {name!r} (this one is {self.type!r})")
        for name in needed - given:
            raise LmforgeError(f"response_format.{name}: type {name!r} needs it")
        if self.type == "json_schema":
            return Constraint.json_schema(self.json_schema.schema_)
        if self.type == "regex":
            return Constraint.regex(self.regex)
        if self.type == "choice":
            return Constraint.choice(self.choice)
        return Constraint.json_object() if self.type == "json_object" else None


class Sampling(Strict):
    """What a completion and a chat completion share."""

    model: Text | None = None
    max_tokens: int | None = declared("max_new_tokens", None)  # None: the server's --max-tokens
    temperature: float = declared("temperature", 1.0)
    top_p: float = declared("top_p", 1.0)
    top_k: int | None = declared("top_k", None)
    repetition_penalty: float = declared("repetition_penalty", 1.0)
    stop: Text | list[Text] | None = Field(None, validate_default=True)  # always a list once checked
    seed: int | None = declared("seed", None)
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # choices of one prompt (not streamed)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: Text | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)  # OpenAI's ranges
    frequency_penalty: float = Field(0.0, ge=-2, le=2, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = Field(None, max_length=MAX_BIASED)
    response_format: ResponseFormat | None = None

    @field_validator("logit_bias")
    @classmethod
    def bias_by_token_id(cls, value: dict[str, float] | None) -> dict[int, float] | None:
        if value is None:
            return None
        out = {}
        for key, bias in value.items():
            if not key.isdigit():
                raise ValueError(f"keys are token ids (\"{key[:20]}\" is not)")
            if not -100 <= bias <= 100 or bias != bias:
                raise ValueError(f"token {key}: a bias is between -100 and 100")
            out[int(key)] = float(bias)
        return out

    @field_validator("stop")
    @classmethod
    def stop_strings(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        try:
            check_range(stops, api_rules(SETTINGS["stop"]), "stop")
        except LmforgeError as err:  # the 400 names the field: the message says the rest
            raise ValueError(str(err).removeprefix("stop: ")) from None
        return stops

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))

    def constraint(self) -> Constraint | None:
        return self.response_format.constraint() if self.response_format is not None else None


class TextPart(Strict):
    """One of OpenAI's content parts; lmforge's models read text."""

    type: Literal["text"]
    text: Text


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None  # left out only by an assistant message that calls tools
    name: Text | None = None
    tool_calls: list[Call] | None = None
    tool_call_id: Text | None = None

    @field_validator("content", mode="before")
    @classmethod
    def text_parts_only(cls, value: Any) -> Any:
        if isinstance(value, list):
            for i, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind not in (None, "text"):
                    raise ValueError(f"part {i} is of type {kind!r}: this server's models read text parts only")
        return value

    def plain(self) -> dict[str, Any]:
        """The message as chat templates take it: content as one string (None when left out), the calls and the
        id of the call answered where given."""
        content = self.content if isinstance(self.content, str | None) else "\n".join(p.text for p in self.content)
        extra = {"name": self.name, "tool_call_id": self.tool_call_id,
                 "tool_calls": [c.model_dump() for c in self.tool_calls] if self.tool_calls is not None else None}
        return {"role": self.role, "content": content} | {k: v for k, v in extra.items() if v is not None}


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: ToolChoice | None = None  # None: "auto" with tools, "none" without
    parallel_tool_calls: bool = True
    max_completion_tokens: int | None = declared("max_new_tokens", None)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)

    @model_validator(mode="after")
    def top_needs_logprobs(self) -> ChatRequest:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs: true")
        return self

    def conversation(self) -> list[dict[str, Any]]:
        return [m.plain() for m in self.messages]

    def top(self) -> int | None:
        """The alternatives each token's log-probability comes with; None: no log-probabilities."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Sampling):
    """A prompt is text or token ids; a list of them is several prompts, answered as choices in order."""

    prompt: Text | list[Text] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=TOP_LOGPROBS)
    max_tokens: int | None = Field(None, ge=0, le=api_rules(SETTINGS["max_new_tokens"])["max"])  # 0: echo only

    @field_validator("prompt")
    @classmethod
    def prompts_given(cls, value: Any) -> Any:
        many = as_prompts(value)
        if not 1 <= len(many) <= MAX_PROMPTS:
            raise ValueError(f"1 to {MAX_PROMPTS} prompts")
        if any(len(p) == 0 for p in many):
            raise ValueError("an empty prompt")
        return value

    @model_validator(mode="after")
    def checked(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:
            raise ValueError("max_tokens: 0 only with echo (the prompt's log-probabilities, nothing generated)")
        if self.stream and (self.echo or len(self.prompts()) > 1):
            raise ValueError("stream: one prompt and no echo when streaming (this server)")
        if self.n > 1 and (self.echo or len(self.prompts()) > 1):
            raise ValueError("n: several choices of one prompt, without echo")
        return self

    def prompts(self) -> list[str | list[int]]:
        return as_prompts(self.prompt)


def as_prompts(prompt: Any) -> list[Any]:
    """A completion's ``prompt`` as a list of prompts: text, token ids, or a list of either."""
    return list(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]


class EmbeddingRequest(Strict):
    input: Text | list[Text] = Field(min_length=1)
    model: Text | None = None
    encoding_format: Literal["float"] = "float"
    user: Text | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ClassifyRequest(Strict):
    input: Text | list[Text] = Field(min_length=1)
    model: Text | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class AttentionRequest(Strict):
    """The chat page's "attention" button: the conversation and the answer to look inside."""

    messages: list[Message] = Field(min_length=1)
    model: Text | None = None

    def conversation(self) -> list[dict[str, Any]]:
        return [m.plain() for m in self.messages]


class TokenizeRequest(Strict):
    """/tokenize: vLLM's shape (``prompt``, ``add_special_tokens``) or llama.cpp's (``content``, ``add_special``).
    Special-token names written in the text are the special tokens, as a tokenizer takes them (the client builds
    the whole prompt: chat text goes through /v1/chat/completions, which never reads them so)."""

    prompt: Text | None = None
    content: Text | None = None
    add_special_tokens: bool | None = None
    add_special: bool | None = None
    with_pieces: bool = False
    model: Text | None = None

    @model_validator(mode="after")
    def one_text(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.content is None):
            raise ValueError("prompt: give the text as prompt (or llama.cpp's content), once")
        return self

    def text(self) -> str:
        return self.prompt if self.prompt is not None else self.content or ""

    def special(self) -> bool:
        return bool(self.add_special_tokens if self.add_special_tokens is not None else self.add_special)


class DetokenizeRequest(Strict):
    tokens: list[int] = Field(max_length=1_000_000)
    model: Text | None = None
