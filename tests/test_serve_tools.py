"""Tool calls (issue 38, item 3): ``tools``, ``tool_choice``, ``parallel_tool_calls`` on /v1/chat/completions.

- the official ``openai`` client's loop: a required (or named) call whose arguments validate against the tool's
  schema, its result sent back as a ``tool`` message, a final text answer; from a tiny model on random weights
  (the grammar alone makes the call valid);
- streamed tool-call deltas reassemble to the call the whole reply gives; "none" gives text; "auto" gives text
  or a call, as the first token decides; parallel calls, and one call when ``parallel_tool_calls`` is false;
- the history's calls and results are rendered: in lmforge's words for a template without a tools section, by the
  template itself where it has one;
- bad tools, choices and histories are 400s naming the field;
- SmolLM2-135M-Instruct's weather loop: the call, then an answer that uses the result (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="the grammar engine (pip install 'lmforge[grammar]')")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) validates the calls")
openai = pytest.importorskip("openai", reason="the official client (dev extra)")
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")
pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")

from lmforge.serve.tools import Tool, conversation, tool_plan  # noqa: E402
from lmforge.tokenizers.byte_bpe import token_bytes  # noqa: E402
from serve_helpers import CHATML, chat_model, live_server  # noqa: E402

WEATHER_ARGS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                 "unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["city", "unit"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city now",
                                            "parameters": WEATHER_ARGS}}
TIME_ARGS = {"type": "object", "properties": {"hours": {"type": "integer", "minimum": 0, "maximum": 23}},
             "required": ["hours"], "additionalProperties": False}
CLOCK = {"type": "function", "function": {"name": "set_alarm", "parameters": TIME_ARGS}}
SCHEMAS = {"get_weather": WEATHER_ARGS, "set_alarm": TIME_ARGS}
QUESTION = [{"role": "user", "content": "what is the weather in paris?"}]
# a template with a tools section (transformers' shape: tools, tool_calls with object arguments, tool messages)
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS {{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}CALL {{ c['function']['name'] }} "
    "{{ c['function']['arguments'] | tojson }}{% endfor %}"
    "{% if m['role'] == 'tool' %} FOR {{ m['tool_call_id'] }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def served(tmp_path_factory, single_thread):
    """(base URL, service) of a tiny chat model (ChatML without a tools section, random weights); a context of
    2,048 holds lmforge's statement of the tools in its 335-token vocabulary."""
    folder = chat_model(tmp_path_factory.mktemp("tools") / "chat-model", max_positions=2048)
    with live_server(folder, slots=8) as (url, service):
        yield url, service


def client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused")


def ask(url: str, messages=QUESTION, **settings):
    settings = {"temperature": 0, "max_tokens": 120, "tools": [WEATHER], **settings}
    return client(url).chat.completions.create(model="chat-model", messages=messages, **settings).choices[0]


def valid_calls(choice) -> list[tuple[str, dict]]:
    """(name, arguments) of each call of a reply, its arguments validated against the tool's schema."""
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = []
    for call in choice.message.tool_calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        calls.append((call.function.name, arguments))
    return calls


def first_tokens(service, char: str) -> dict[str, float]:
    """A logit_bias for the tokens whose text begins with ``char`` (steers "auto" towards or away from a call)."""
    tok = service.tokenizer
    return {str(i): 1 for i in range(tok.vocab_size) if token_bytes(tok, i).startswith(char.encode())}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_the_openai_clients_tool_loop(served, choice):
    """Call (validated) -> the tool's result as a ``tool`` message -> a final text answer ending with "stop"."""
    url, _ = served
    first = ask(url, tools=[WEATHER, CLOCK], tool_choice=choice, parallel_tool_calls=False)
    [(name, _)] = valid_calls(first)
    assert name == "get_weather" or choice == "required"
    result = {"role": "tool", "tool_call_id": first.message.tool_calls[0].id, "content": '{"celsius": 18}'}
    history = [*QUESTION, first.message.model_dump(exclude_none=True), result]
    final = ask(url, history, tools=[WEATHER, CLOCK], tool_choice="none", stop=["e"])
    assert final.finish_reason == "stop" and final.message.tool_calls is None
    assert isinstance(final.message.content, str)


def test_streamed_deltas_reassemble_to_the_whole_replys_call(served):
    url, _ = served
    settings = {"tools": [WEATHER, CLOCK], "tool_choice": "required", "temperature": 0.8, "seed": 7}
    whole = ask(url, **settings)
    calls: dict[int, dict] = {}
    reasons, first_delta = [], None
    for chunk in client(url).chat.completions.create(model="chat-model", messages=QUESTION, max_tokens=120,
                                                     stream=True, **settings):
        delta = chunk.choices[0].delta
        reasons.append(chunk.choices[0].finish_reason)
        assert not delta.content
        for d in delta.tool_calls or ():
            if d.id is not None:  # the first delta of a call: index, id, type, name (and no arguments yet)
                first_delta = first_delta or d
                calls[d.index] = {"id": d.id, "name": d.function.name, "arguments": d.function.arguments or ""}
                assert d.type == "function"
            else:
                calls[d.index]["arguments"] += d.function.arguments
    assert reasons[-1] == "tool_calls" and set(reasons[:-1]) == {None}
    assert first_delta.function.arguments == ""
    assert [(c["name"], json.loads(c["arguments"])) for _, c in sorted(calls.items())] == valid_calls(whole)
    assert [c["arguments"] for c in calls.values()] == [c.function.arguments for c in whole.message.tool_calls]


def test_none_gives_text_and_auto_text_or_a_call(served):
    url, service = served
    none = ask(url, tool_choice="none", max_tokens=20)
    assert none.finish_reason == "length" and none.message.tool_calls is None and none.message.content
    towards = {k: 100.0 for k in first_tokens(service, "{")}  # the first token begins the call form
    assert [name for name, _ in valid_calls(ask(url, logit_bias=towards, parallel_tool_calls=False))] == \
        ["get_weather"]
    away = {k: -100.0 for k in first_tokens(service, "{")}
    text = ask(url, logit_bias=away, max_tokens=20)  # "auto" is the default with tools
    assert text.message.tool_calls is None and text.finish_reason == "length" and text.message.content[0] != "{"


def test_parallel_calls_and_one_call_when_not_parallel(served):
    """Sampled replies of four seeds: some hold two calls (each validated) where parallel calls are allowed."""
    url, _ = served
    for parallel in (True, False):
        counts = [len(valid_calls(ask(url, tools=[WEATHER, CLOCK], tool_choice="required", max_tokens=300,
                                      parallel_tool_calls=parallel, temperature=1.0, seed=seed)))
                  for seed in range(4)]
        assert max(counts) >= 2 if parallel else counts == [1] * 4, (parallel, counts)


def test_histories_are_rendered_in_lmforges_words_without_a_tools_section(served):
    """The tools and the form in the system turn; an earlier call in the call form; results as a user turn."""
    _, service = served
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "paris", "unit": "celsius"}'}}
    history = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 18"}]
    plan = tool_plan([Tool.model_validate(WEATHER)], "auto", True, service.tokenizer, False)
    messages, tools = conversation(history, plan, service.chat_format.uses_tools)
    text = service.chat_format.render(messages)
    assert tools is None and not service.chat_format.uses_tools
    assert '{"name": "get_weather", "description": "The weather in a city now", "parameters": ' in text
    assert '<|im_start|>assistant\n{"tool_calls": [{"name": "get_weather", "arguments": {"city": "paris", ' \
        '"unit": "celsius"}}]}<|im_end|>' in text
    assert "<|im_start|>user\nThe tools answered:\nget_weather: sunny, 18\nNow answer the user's question " \
        "in plain text.<|im_end|>\n<|im_start|>assistant\n" in text


def test_a_template_with_a_tools_section_renders_them_itself(tmp_path, single_thread):
    folder = chat_model(tmp_path / "chat-model", max_positions=2048, template=TOOLS_TEMPLATE)
    with live_server(folder, slots=2) as (url, service):
        assert service.chat_format.uses_tools
        first = ask(url, tool_choice="required")
        [(_, arguments)] = valid_calls(first)
        call = first.message.tool_calls[0]
        history = [*QUESTION, first.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
        plan = tool_plan([Tool.model_validate(WEATHER)], "auto", True, service.tokenizer, False)
        messages, tools = conversation(history, plan, True)
        text = service.chat_format.template.render(messages, True, tools=tools)
        assert 'TOOLS [{"type": "function", "function": {"name": "get_weather", "description": ' in text
        assert f"CALL get_weather {json.dumps(arguments, ensure_ascii=False)}" in text
        assert f"<|im_start|>tool\nsunny FOR {call.id}<|im_end|>" in text
        final = ask(url, history, tool_choice="none", stop=["e"])
        assert final.finish_reason == "stop" and final.message.tool_calls is None


def test_chatml_without_tools_is_not_a_tools_section():
    from lmforge.tokenizers.chat import ChatTemplate

    assert not ChatTemplate(CHATML).uses_tools and ChatTemplate(TOOLS_TEMPLATE).uses_tools


def bad(url: str, **body) -> tuple[int, str | None, str]:
    body = {"messages": QUESTION, "tools": [WEATHER], "max_tokens": 4, **body}
    r = requests.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    error = r.json()["error"]
    return r.status_code, error["param"], error["message"]


def tool(name="f", parameters=None, **extra):
    return {"type": "function", "function": {"name": name, **({"parameters": parameters} if parameters is not None
                                                                else {}), **extra}}


@pytest.mark.parametrize(("body", "param"), [
    ({"tools": [WEATHER, WEATHER]}, "tools.1.function.name"),
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [tool(parameters={"type": "string"})]}, "tools.0.function.parameters"),
    ({"tools": [tool(parameters=[1, 2])]}, "tools.0.function.parameters"),
    ({"tools": [tool(parameters={"type": "object", "properties": {"a": {"type": "nonsense"}}})]},
     "tools.0.function.parameters"),
    ({"tools": [tool(name="has space")]}, "tools.0.function.name"),
    ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools.0.type"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"messages": [*QUESTION, {"role": "tool", "tool_call_id": "call_x", "content": "18"}]}, "messages.1.tool_call_id"),
    ({"messages": [*QUESTION, {"role": "tool", "content": "18"}]}, "messages.1.tool_call_id"),
    ({"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}, "messages.0.tool_calls"),
])
def test_bad_tools_are_400_naming_the_field(served, body, param):
    status, given, message = bad(served[0], **body)
    assert (status, given) == (400, param), message
    assert message.startswith(param), message


def test_tools_with_choice_none_leave_response_format_free(served):
    url, _ = served
    r = requests.post(f"{url}/v1/chat/completions", timeout=60, json={
        "messages": QUESTION, "tools": [WEATHER], "tool_choice": "none", "temperature": 0, "max_tokens": 40,
        "response_format": {"type": "choice", "choice": ["sunny", "rain"]}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("sunny", "rain")


# -- SmolLM2 through the official openai client (slow) -----------------------------------------------------------
@pytest.mark.slow
def test_smollm2_weather_loop_through_the_openai_client():
    """SmolLM2-135M-Instruct (its ChatML template has no tools section: lmforge's words) calls get_weather for
    Paris in the required form, and, given the result, answers in text, in "auto" and in "none"."""
    from lmforge.data.sources import smollm2_path

    weather = {"type": "function", "function": {"name": "get_weather", "description": "Get the current weather "
                                                "in a city", "parameters": {**WEATHER_ARGS, "properties": {
                                                    "city": {"type": "string", "maxLength": 40},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}}}}}
    with live_server(smollm2_path(), slots=4) as (url, _):
        chat = client(url).chat.completions
        question = [{"role": "user", "content": "What is the weather like in Paris today?"}]
        first = chat.create(model="SmolLM2-135M-Instruct.Q4_1", messages=question, tools=[weather],
                            tool_choice="required", temperature=0, max_tokens=80).choices[0]
        assert first.finish_reason == "tool_calls" and first.message.content is None
        [call] = first.message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == \
            ("get_weather", {"city": "Paris", "unit": "celsius"})
        history = [*question, first.message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": json.dumps(
                       {"temperature": 18, "unit": "celsius", "sky": "sunny"})}]
        for choice in ("auto", "none"):
            final = chat.create(model="SmolLM2-135M-Instruct.Q4_1", messages=history, tools=[weather],
                                tool_choice=choice, temperature=0, max_tokens=60).choices[0]
            assert final.finish_reason == "stop" and final.message.tool_calls is None
            assert "sunny" in final.message.content, final.message.content


def test_a_reader_walks_the_call_form_piece_by_piece():
    """The reply's text may come in any pieces: the calls read are the same (and strings holding braces, quotes
    and escapes do not end the arguments)."""
    from lmforge.serve.tool_calls import CallReader

    text = '{"tool_calls": [{"name": "a", "arguments": {"s": "}\\"{", "n": [1, {"x": null}]}}, ' \
        '{"name": "b_2", "arguments": {}}]}'
    for size in (1, 2, 5, len(text)):
        reader = CallReader()
        for i in range(0, len(text), size):
            reader.feed(text[i: i + size])
        assert reader.complete and reader.reason("stop") == "tool_calls"
        calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in reader.calls]
        assert calls == [(c["name"], c["arguments"]) for c in json.loads(text)["tool_calls"]]
    text_reader = CallReader()
    assert text_reader.feed("hello {") == [{"content": "hello {"}] and text_reader.message()["content"] == "hello {"


def test_a_pydantic_tool_through_the_clients_parse(served):
    """``openai.pydantic_function_tool``'s schema (``$defs`` and ``$ref``, strict) is forced as it stands, and the
    client's ``parse`` reads the call into the pydantic model."""
    from enum import StrEnum

    from pydantic import BaseModel, Field

    class Unit(StrEnum):
        celsius = "celsius"
        fahrenheit = "fahrenheit"

    class Place(BaseModel):
        city: str = Field(max_length=10)
        country: str = Field(max_length=10)

    class GetWeather(BaseModel):
        """The weather in a place."""

        place: Place
        unit: Unit

    url, _ = served
    chat = client(url).chat.completions
    parse = getattr(chat, "parse", None) or client(url).beta.chat.completions.parse
    out = parse(model="chat-model", messages=QUESTION, tools=[openai.pydantic_function_tool(GetWeather)],
                tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200)
    [call] = out.choices[0].message.tool_calls
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert call.function.parsed_arguments == GetWeather.model_validate_json(call.function.arguments)


def test_n_choices_each_read_for_calls(served):
    url, _ = served
    out = client(url).chat.completions.create(model="chat-model", messages=QUESTION, tools=[WEATHER, CLOCK], n=3,
                                              tool_choice="required", temperature=1.0, seed=3, max_tokens=300)
    assert [c.index for c in out.choices] == [0, 1, 2]
    assert all(valid_calls(c) for c in out.choices)
    assert len({c.message.tool_calls[0].function.arguments for c in out.choices}) > 1  # seeds 3, 4, 5


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="stops the server through Linux's /proc")
def test_the_split_server_carries_a_tool_grammar_to_its_engine(tmp_path):
    """``lmforge serve --http-process``: the call form's grammar crosses the pipe, the call comes back read."""
    from test_serve_split import start, stop

    proc, url = start(chat_model(tmp_path / "chat-model", max_positions=2048), "--slots", "2")
    try:
        [(name, _)] = valid_calls(ask(url, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                      parallel_tool_calls=False))
        assert name == "get_weather"
    finally:
        stop(proc)
