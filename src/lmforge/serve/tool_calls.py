"""A reply to a request with tools, read as it arrives: text, or calls in the form the grammar forces (tools.py)

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": ...}]}

and turned into OpenAI's shapes: ``message.tool_calls`` ``[{"id": "call_...", "type": "function", "function":
{"name": ..., "arguments": "<JSON text>"}}]`` with ``content`` null, or, streamed, the tool-call deltas: the
first of a call carries its index, id, type and name, the next ones pieces of its arguments' text.

The grammar fixes the layout (", " and ": " between items, no other whitespace, ``name`` before ``arguments``,
names of ``[a-zA-Z0-9_-]`` only), so the reader walks it without a JSON parser: the literal pieces are skipped,
the name is read up to its quote, the arguments up to the brace that closes them (strings and escapes followed).
The first character decides: "{" begins the calls (the grammar allows text that begins otherwise, and only that).
"""

from __future__ import annotations

import uuid
from typing import Any

from lmforge.serve.tools import ARGUMENTS, CALL_OPEN, CALLS_CLOSE, CALLS_OPEN


class CallReader:
    """Feeds on a reply's text (``feed``), giving the OpenAI deltas it makes; ``message`` answers the whole."""

    def __init__(self) -> None:
        self.text = ""
        self.at = 0  # characters of ``text`` read
        self.mode: str | None = None  # "text" or "calls", once the first character has come
        self.calls: list[dict[str, Any]] = []  # {"id", "type", "function": {"name", "arguments"}}
        self.step = "open"  # open, call, name, head, arguments, close, next, done
        self.depth, self.quoted, self.escaped = 0, False, False

    @property
    def complete(self) -> bool:
        return self.step == "done"

    def feed(self, piece: str) -> list[dict[str, Any]]:
        """The deltas of the next ``piece`` of text: ``{"content": ...}`` in text, ``{"tool_calls": [...]}`` in
        calls (none while a literal piece or a name is being read)."""
        self.text += piece
        if self.mode is None and self.text:
            self.mode = "calls" if self.text.startswith("{") else "text"
        if self.mode == "text":
            return [{"content": piece}] if piece else []
        deltas = []
        while self.mode == "calls" and (delta := self.advance()) is not False:
            if delta is not None:
                deltas.append({"tool_calls": [delta]})
        return deltas

    def literal(self, text: str, then: str) -> bool | None:
        """Skip ``text`` once it has all come; False while it has not."""
        if len(self.text) - self.at < len(text):
            return False
        self.at += len(text)
        self.step = then
        return None

    def advance(self) -> dict[str, Any] | bool | None:
        """One step of the walk: a delta, None (a step without one) or False (wait for more text)."""
        if self.step == "open":
            return self.literal(CALLS_OPEN, "call")
        if self.step == "call":
            return self.literal(CALL_OPEN, "name")
        if self.step == "name":
            end = self.text.find('"', self.at)
            if end < 0:
                return False
            call = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": self.text[self.at:end], "arguments": ""}}
            self.calls.append(call)
            self.at, self.step = end, "head"
            return {"index": len(self.calls) - 1, **call, "function": dict(call["function"])}
        if self.step == "head":
            return self.literal(ARGUMENTS, "arguments")
        if self.step == "arguments":
            return self.arguments()
        if self.step == "close":
            return self.literal("}", "next")
        if self.step == "next" and len(self.text) - self.at >= 2:
            follows = self.text[self.at: self.at + 2]
            return self.literal(follows, "done" if follows == CALLS_CLOSE else "call")
        return False

    def arguments(self) -> dict[str, Any] | bool:
        """The arguments' text that has come, up to the brace that closes them."""
        start = self.at
        for ch in self.text[start:]:
            self.at += 1
            if self.escaped:
                self.escaped = False
            elif self.quoted:
                self.escaped, self.quoted = ch == "\\", ch != '"'
            elif ch == '"':
                self.quoted = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.step = "close"
                    break
        piece = self.text[start: self.at]
        if not piece:
            return False
        self.calls[-1]["function"]["arguments"] += piece
        return {"index": len(self.calls) - 1, "function": {"arguments": piece}}

    def message(self) -> dict[str, Any]:
        """The whole reply as the assistant's message: content, or calls (content null)."""
        if self.mode == "calls":
            return {"role": "assistant", "content": None, "tool_calls": self.calls}
        return {"role": "assistant", "content": self.text}

    def reason(self, finish: str) -> str:
        """The finish reason: "tool_calls" when the calls were completed, else the generation's."""
        return "tool_calls" if self.mode == "calls" and self.complete else finish
