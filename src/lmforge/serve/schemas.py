"""The request bodies of the OpenAI-shaped API, checked field by field (a bad one is a 400 naming the field).

Fields the OpenAI API knows and lmforge does not implement are accepted only at their neutral value
(``presence_penalty: 0``, ``n: 1``, ``echo: false``); a field the OpenAI API would reject is rejected here too
(``extra="forbid"``). lmforge adds ``top_k`` and ``repetition_penalty``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Sampling(BaseModel):
    """What a completion and a chat completion share."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int | None = Field(None, ge=1)
    repetition_penalty: float = Field(1.0, gt=0)
    stop: str | list[str] | None = Field(None, validate_default=True)  # always a list once checked
    seed: int | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    presence_penalty: Literal[0, 0.0] = 0
    frequency_penalty: Literal[0, 0.0] = 0

    @field_validator("stop")
    @classmethod
    def stop_strings(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("up to 4 non-empty stop strings")
        return stops

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    name: str | None = None


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: Literal[False] = False
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions

    @field_validator("prompt")
    @classmethod
    def one_prompt(cls, value: str | list[str]) -> str:
        if isinstance(value, list):
            if len(value) != 1:
                raise ValueError("one prompt per request (n = 1)")
            value = value[0]
        if not value:
            raise ValueError("an empty prompt")
        return value


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] = Field(min_length=1)
    model: str | None = None
    encoding_format: Literal["float"] = "float"
    user: str | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input: str | list[str] = Field(min_length=1)
    model: str | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


class AttentionRequest(BaseModel):
    """The chat page's "attention" button: the conversation and the answer to look inside."""

    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
