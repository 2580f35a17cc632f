"""Tool calls on /v1/chat/completions: the request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, the
prompt that states them, and the grammar that makes a call valid (the reply is read by ``tool_calls.py``).

A call is written in one form, whatever the model, and the grammar engine holds the model to it::

    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}

    tool_choice       the grammar (``Constraint.lark``)                      the reply
    "none"            none: the tools are not stated                         text
    "auto" (default)  text that does not begin with "{", or the call form    text, or calls
    "required"        the call form, any of the tools                        calls
    {"function": ...} the call form, that tool only                          one call of it (several if parallel)

Each call's ``arguments`` are JSON of that tool's ``parameters`` schema (llguidance's ``%json``, in the server's
one JSON layout), so a call always parses and validates; with ``parallel_tool_calls: false`` the list holds one.
In "auto" the first character decides: "{" begins the call form, which then must be completed; any other
begins free text. Forcing is cheap (the grammar's masks cost what a JSON schema's do) and it is the only way a
small model's call is valid JSON at all; parsing the text after the fact would take what the model wrote.

The prompt: a template that uses ``tools`` (its Jinja names the variable) is given them and the history in
transformers' shape (``tool_calls`` with ``arguments`` as an object, ``tool`` messages with ``tool_call_id``).
A template without a tools section gets lmforge's own words instead, in the system turn (llama.cpp's server has
the same generic fallback): the tools as JSON lines and the reply form. Either way the system turn says which
form to reply in. Earlier calls are rendered in the call form as the assistant's text, and a run of tool results
as one user turn ("The tools answered:", a line each, "Now answer the user's question in plain text."), which
every template can render.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lmforge.errors import LmforgeError
from lmforge.generation.constraints import JSON_LAYOUT, Constraint, check

MAX_TOOLS = 128  # OpenAI's limit
NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's function names: no quote or escape ever needs writing
NO_ARGUMENTS = {"type": "object", "properties": {}, "additionalProperties": False}  # parameters left out
CALLS_OPEN, CALL_OPEN, ARGUMENTS, CALLS_CLOSE = '{"tool_calls": [', '{"name": "', '", "arguments": ', "]}"
RESULTS = "The tools answered:"  # the user turn that brings results back (lmforge's words), then a line each
ANSWER = "Now answer the user's question in plain text."  # (SmolLM2-135M answered in text with these words only)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Function(Strict):
    name: str = Field(pattern=NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of an object; none: no arguments
    strict: bool | None = None  # accepted; a forced call always follows its schema


class Tool(Strict):
    type: Literal["function"]
    function: Function


class Named(Strict):
    name: str


class NamedChoice(Strict):
    """``{"type": "function", "function": {"name": "..."}}``: this tool must be called."""

    type: Literal["function"]
    function: Named


ToolChoice = Literal["auto", "none", "required"] | NamedChoice


class CalledFunction(Strict):
    name: str
    arguments: str  # JSON, as OpenAI sends it back


class Call(Strict):
    """An earlier call, in an assistant message of the history."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


@dataclass(frozen=True)
class ToolPlan:
    """The tools a reply may call (the named one alone when the choice names one), whether it must, and whether
    it may make several calls."""

    tools: tuple[Function, ...]
    required: bool
    parallel: bool

    def constraint(self) -> Constraint:
        """The grammar of the reply: the call form (and, when not required, text that does not begin with "{")."""
        names = [f"call_{i}" for i in range(len(self.tools))]
        rules = ["start: calls" if self.required else "start: text | calls", r"text: /([^{][\s\S]*)?/",
                 f"calls: {json.dumps(CALLS_OPEN)} call" + ("" if not self.parallel else ' (", " call)*') +
                 f" {json.dumps(CALLS_CLOSE)}", "call: " + " | ".join(names)]
        for name, f in zip(names, self.tools, strict=True):
            schema = {**(f.parameters or NO_ARGUMENTS), "x-guidance": JSON_LAYOUT}
            rules.append(f'{name}: {json.dumps(CALL_OPEN + f.name + ARGUMENTS)} %json {json.dumps(schema)} "}}"')
        return Constraint.lark("\n".join(rules), field="tools")

    def instructions(self, states_tools: bool) -> str:
        """What lmforge adds to the system turn: the tools (unless the template states them) and the form."""
        lines = []
        if states_tools:
            lines += ["You can call these tools. Each line is one tool as JSON: its name, what it does, and the "
                      "JSON schema of its arguments."]
            lines += [json.dumps({"name": f.name, "description": f.description or "",
                                  "parameters": f.parameters or NO_ARGUMENTS}, ensure_ascii=False)
                      for f in self.tools]
        example = json.dumps({"tool_calls": [{"name": self.tools[0].name if len(self.tools) == 1 else "tool name",
                                              "arguments": {"argument": "value"}}]})
        how = "To call a tool, reply with only a JSON object, nothing before or after it, in this form:"
        if self.required:
            how = f"Call {'the tool ' + self.tools[0].name if len(self.tools) == 1 else 'a tool'} now: reply " \
                  "with only a JSON object, in this form:"
        lines += [how, example]
        if self.parallel:
            lines.append("Several calls may go in the list.")
        if not self.required:
            lines.append("When no tool is needed, answer in plain text.")
        lines.append("The results of your calls come back in the next message.")
        return "\n".join(lines)


def tool_plan(tools: list[Tool] | None, choice: ToolChoice | None, parallel: bool, tokenizer: Any,
              other_format: bool) -> ToolPlan | None:
    """The plan of a request's tools (None: a reply of text), or one line naming the field at fault: duplicate
    names, a choice naming no tool, a choice without tools, parameters that are not an object schema or that the
    grammar engine refuses, a ``response_format`` beside tools that may be called."""
    tools = tools or []
    names = [t.function.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise LmforgeError(f"tools.{i}.function.name: {name!r} is the name of an earlier tool too")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice != "none" and not tools:
        raise LmforgeError("tool_choice: there are no tools to call (give tools, or leave tool_choice out)")
    if choice == "none":
        return None
    if other_format:
        raise LmforgeError("response_format: not with tools that may be called (use tool_choice 'none', or a tool "
                           "whose parameters are the schema)")
    for i, t in enumerate(tools):
        check_parameters(t.function.parameters, f"tools.{i}.function.parameters", tokenizer)
    functions = tuple(t.function for t in tools)
    if isinstance(choice, NamedChoice):
        if choice.function.name not in names:
            raise LmforgeError(f"tool_choice.function.name: no tool is named {choice.function.name!r} (the tools: "
                               f"{', '.join(names)})")
        functions = (functions[names.index(choice.function.name)],)
    return ToolPlan(functions, required=choice != "auto", parallel=parallel)


def check_parameters(schema: dict[str, Any] | None, field: str, tokenizer: Any) -> None:
    """A tool's parameters: a JSON schema of an object that the grammar engine compiles (its words, the field)."""
    if schema is None:
        return
    if schema.get("type", "object") != "object":
        raise LmforgeError(f"{field}: the schema of the arguments is of type 'object' (this one: "
                           f"{schema.get('type')!r})")
    check(Constraint.json_schema(schema, field=field), tokenizer)


def call_text(calls: list[dict[str, Any]]) -> str:
    """Earlier calls in the call form, as the model would have written them."""
    return json.dumps({"tool_calls": [{"name": c["function"]["name"], "arguments": arguments(c)} for c in calls]},
                      ensure_ascii=False)


def arguments(call: dict[str, Any]) -> Any:
    """A call's arguments as data (transformers' templates read an object); text that is not JSON stays text."""
    try:
        return json.loads(call["function"]["arguments"])
    except json.JSONDecodeError:
        return call["function"]["arguments"]


def conversation(messages: list[dict[str, Any]], plan: ToolPlan | None,
                 template_tools: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) for the chat template: in transformers' shape where the template uses ``tools``, else
    in lmforge's words (module docstring); the system turn says how to call when a call may come."""
    named = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    out: list[dict[str, Any]] = []
    for m in messages:
        if template_tools:
            m = dict(m, content=m.get("content") or "")
            if m.get("tool_calls"):
                m["tool_calls"] = [dict(c, function={**c["function"], "arguments": arguments(c)})
                                   for c in m["tool_calls"]]
            if m["role"] == "tool":
                m["name"] = named.get(m["tool_call_id"], "")
            out.append(m)
        elif m["role"] == "tool":
            result = f"{named.get(m['tool_call_id'], 'tool')}: {m.get('content') or ''}"
            if out and out[-1].get("results"):
                out[-1]["results"].append(result)
            else:
                out.append({"role": "user", "results": [result]})
        elif m.get("tool_calls"):
            out.append({"role": "assistant", "content": "\n".join(filter(None, [m.get("content"),
                                                                                 call_text(m["tool_calls"])]))})
        else:
            out.append({k: v for k, v in m.items() if k != "tool_calls"})
    out = [{"role": "user", "content": "\n".join([RESULTS, *m["results"], ANSWER])} if "results" in m else m
           for m in out]
    if plan is not None:
        out = with_system(out, plan.instructions(states_tools=not template_tools))
    given = [{"type": "function", "function": f.model_dump(exclude_none=True)} for f in plan.tools] \
        if plan is not None and template_tools else None
    return out, given


def with_system(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The conversation with ``text`` at the end of its system turn (a new system turn first if it has none)."""
    if messages and messages[0]["role"] == "system":
        return [dict(messages[0], content=f"{messages[0]['content']}\n\n{text}".lstrip()), *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def check_history(messages: list[dict[str, Any]]) -> None:
    """Tool messages answer an earlier call (``tool_call_id``); calls come from the assistant; content is left out
    only by an assistant message that calls."""
    ids: set[str] = set()
    for i, m in enumerate(messages):
        if m.get("tool_calls") and m["role"] != "assistant":
            raise LmforgeError(f"messages.{i}.tool_calls: only an assistant message holds calls")
        ids |= {c["id"] for c in m.get("tool_calls") or ()}
        if m["role"] == "tool" and m.get("tool_call_id") not in ids:
            raise LmforgeError(f"messages.{i}.tool_call_id: a tool message answers a call of an earlier assistant "
                               f"message ({m.get('tool_call_id')!r} is none of theirs)")
        if m["role"] != "tool" and m.get("tool_call_id") is not None:
            raise LmforgeError(f"messages.{i}.tool_call_id: only a tool message answers a call")
        if m.get("content") is None and not (m["role"] == "assistant" and m.get("tool_calls")):
            raise LmforgeError(f"messages.{i}.content: needed (only an assistant message that calls tools may "
                               "leave it out)")
