"""Structured output (issue 38, item 2): ``response_format`` and the engine's constraints (generation/constraints.py).

- every reply of 100 random JSON schemas (a seeded generator) ends with "stop" and validates against its schema
  (``jsonschema``), from a tiny model on random weights: the masks alone make it valid;
- json_object gives a JSON object, a regex and a choice list are honoured;
- a free request beside constrained ones gets the same tokens as alone (the masks touch only their own rows);
- bad schemas, bad regexes, unknown types, a missing grammar engine are 400s naming the field;
- SmolLM2 through the official ``openai`` client, ``response_format`` and ``parse`` with a pydantic model (slow).
"""

from __future__ import annotations

import json
import pickle
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("llguidance", reason="the grammar engine (pip install 'lmforge[grammar]')")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema (dev extra) validates the replies")

from lmforge.generation.constraints import Constraint  # noqa: E402
from lmforge.generation.lm import LM  # noqa: E402
from lmforge.interop.directories import load  # noqa: E402
from serve_helpers import chat_model  # noqa: E402

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}


CHOICES = ["paris", "été", 'say "hi"', "back\\slash", "tab\there"]  # escapes and non-ASCII survive


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """A JSON schema whose every value is bounded (short strings, bounded integers, at most 3 items or
    properties), so that any reply that follows it ends within ~150 tokens."""
    kinds = ["string", "integer", "boolean", "null", "enum", "pattern"]  # no "number": its decimals are unbounded
    if depth < 2:
        kinds += ["object", "object", "array", "anyOf"]
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "minLength": rng.randint(0, 2), "maxLength": rng.randint(2, 6)}
    if kind == "integer":
        low = rng.randint(-1000, 1000)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 5000)}
    if kind in ("boolean", "null"):
        return {"type": kind}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 1, 2.5, True, None, "x y"], rng.randint(1, 4))}
    if kind == "pattern":
        return {"type": "string", "pattern": rng.choice([r"^[a-z]{2,4}$", r"^\d{3}-\d{2}$", r"^(yes|no)$"])}
    if kind == "array":
        low = rng.randint(0, 2)
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": low,
                "maxItems": low + rng.randint(0, 1)}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(2)]}
    names = rng.sample(["id", "name", "tags", "ok", "size", "kind", "note"], rng.randint(1, 3))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": names, "additionalProperties": False}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, single_thread):
    """A tiny chat model (byte-level tokenizer of 335 tokens, random weights) and its LM of 16 slots."""
    model, tok = load(chat_model(tmp_path_factory.mktemp("grammar") / "chat-model"))
    return LM(model, tok, slots=16, capacity=256), tok


def reply(tok, generation) -> str:
    ends = generation.tokens[-1:] == [tok.eos_id]
    return tok.decode(generation.tokens[:-1] if ends else generation.tokens)


def test_replies_to_100_random_schemas_validate(tiny):
    lm, tok = tiny
    rng = random.Random(38)
    schemas = [random_schema(rng) for _ in range(100)]
    prompt = tok.encode("hello there, how are you today?", add_special_tokens=False).ids
    generations = lm.run([lm_request(prompt, Constraint.json_schema(s)) for s in schemas])
    for schema, g in zip(schemas, generations, strict=True):
        assert g.finish_reason == "stop", (schema, reply(tok, g))
        jsonschema.validate(json.loads(reply(tok, g)), schema)
    kinds = {type(json.loads(reply(tok, g))).__name__ for g in generations}
    assert {"dict", "list", "str", "int"} <= kinds  # the generator's variety reached the replies


def lm_request(prompt, constraint, max_new_tokens=200, **settings):
    from lmforge.generation.requests import Request

    return Request(prompt, max_new_tokens=max_new_tokens, constraint=constraint, **settings)


def test_json_object_regex_and_choice_are_honoured(tiny):
    lm, tok = tiny
    prompt = tok.encode("what is the capital of france?", add_special_tokens=False).ids
    closing = {tok.token_to_id(t): 4.0 for t in ('"', "}")}  # random weights never end a string: help them
    obj, code, pick, sampled = lm.run([
        lm_request(prompt, Constraint.json_object(), logit_bias=closing),
        lm_request(prompt, Constraint.regex(r"[A-Z]{2}-[0-9]{3}")),
        lm_request(prompt, Constraint.choice(CHOICES)),
        lm_request(prompt, Constraint.json_schema(PERSON), temperature=1.0, seed=5)])
    assert [g.finish_reason for g in (obj, code, pick, sampled)] == ["stop"] * 4
    assert isinstance(json.loads(reply(tok, obj)), dict)
    assert re.fullmatch(r"[A-Z]{2}-[0-9]{3}", reply(tok, code))
    assert reply(tok, pick) in CHOICES
    jsonschema.validate(json.loads(reply(tok, sampled)), PERSON)


def test_a_free_request_beside_constrained_ones_gets_its_tokens_alone(tiny):
    lm, tok = tiny
    prompt = tok.encode("the cat sat on the mat", add_special_tokens=False).ids
    free = [lm_request(prompt, None, max_new_tokens=40), lm_request(prompt, None, temperature=0.9, seed=3)]
    alone = [g.tokens for g in lm.run(free)]
    constrained = [lm_request(prompt, Constraint.json_schema(PERSON)) for _ in range(5)] + \
        [lm_request(prompt, Constraint.regex(r"(ab|cd)+e"))]
    mixed = lm.run([constrained[0], free[0], *constrained[1:3], free[1], *constrained[3:]])
    assert [mixed[1].tokens, mixed[4].tokens] == alone
    assert alone[0] != mixed[0].tokens  # the constraint changed its own rows only


def test_a_lark_grammar_puts_a_json_schema_after_free_text(tiny):
    """The shape a tool call needs: free text, a marker, then JSON of a schema (llguidance's ``%json``)."""
    lm, tok = tiny
    schema = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["x"], "additionalProperties": False, "x-guidance": {"whitespace_flexible": False}}
    grammar = 'start: /[a-z ]{0,12}/ "<call>" call\ncall: %json ' + json.dumps(schema)
    prompt = tok.encode("hello there", add_special_tokens=False).ids
    for g in lm.run([lm_request(prompt, Constraint.lark(grammar), temperature=1.0, seed=s) for s in range(4)]):
        text, _, call = reply(tok, g).partition("<call>")
        assert g.finish_reason == "stop" and re.fullmatch("[a-z ]{0,12}", text)
        jsonschema.validate(json.loads(call), schema)


def test_a_constraint_is_plain_data_that_crosses_a_pipe():
    c = Constraint.json_schema(PERSON)
    assert pickle.loads(pickle.dumps(c)) == c


# -- through the HTTP server -------------------------------------------------------------------------------------
requests = pytest.importorskip("requests", reason="requests (dev extra) sends the raw HTTP requests")
pytest.importorskip("fastapi", reason="the server needs the serve extra (pip install 'lmforge[serve]')")


@pytest.fixture(scope="module")
def served(tmp_path_factory, single_thread):
    from serve_helpers import live_server

    with live_server(chat_model(tmp_path_factory.mktemp("grammar-http") / "chat-model"), slots=8) as (url, service):
        yield url, {str(service.tokenizer.token_to_id(t)): 4.0 for t in ('"', "}")}  # a bias: random strings end


def post(url: str, route: str = "chat/completions", **body):
    fields = {"messages": [{"role": "user", "content": "hello"}]} if route == "chat/completions" else \
        {"prompt": "hello there"}
    return requests.post(f"{url}/v1/{route}", json={"temperature": 0, "max_tokens": 150, **fields, **body},
                         timeout=60)


def answer(r) -> tuple[str, str]:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"], choice["finish_reason"]


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_response_format_over_http(served, route):
    served, closing = served
    schema = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    text, reason = answer(post(served, route, response_format=schema))
    assert reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
    text, reason = answer(post(served, route, response_format={"type": "json_object"}, logit_bias=closing))
    assert reason == "stop" and isinstance(json.loads(text), dict)
    text, _ = answer(post(served, route, response_format={"type": "regex", "regex": r"[0-9]{4}-[0-9]{2}"}))
    assert re.fullmatch(r"[0-9]{4}-[0-9]{2}", text)
    text, _ = answer(post(served, route, response_format={"type": "choice", "choice": ["yes", "no"]}))
    assert text in ("yes", "no")
    assert answer(post(served, route, response_format={"type": "text"})) == answer(post(served, route))


def test_streamed_and_n_choices_are_constrained(served):
    served, _ = served
    r = post(served, response_format={"type": "choice", "choice": ["red", "green", "blue"]}, n=3, temperature=1.0)
    assert r.status_code == 200, r.text
    assert all(c["message"]["content"] in ("red", "green", "blue") for c in r.json()["choices"])
    r = post(served, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
             stream=True)
    deltas = [json.loads(line[6:])["choices"] for line in r.text.splitlines()
              if line.startswith("data: {")]
    text = "".join(c[0]["delta"].get("content") or "" for c in deltas if c)
    jsonschema.validate(json.loads(text), PERSON)


BAD = [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objekt"}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "(("}}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": "not a schema"}},
     "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"schema": PERSON}}, "response_format.json_schema.name"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "regex", "regex": "(unclosed"}, "response_format.regex"),
    ({"type": "regex"}, "response_format.regex"),
    ({"type": "choice", "choice": []}, "response_format.choice"),
    ({"type": "text", "regex": "a"}, "response_format.regex"),
    ({"type": "yaml"}, "response_format.type"),
    ("json", "response_format"),
]


@pytest.mark.parametrize(("response_format", "param"), BAD)
def test_bad_response_formats_are_400_naming_the_field(served, response_format, param):
    served, _ = served
    r = post(served, response_format=response_format)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_without_the_grammar_engine_a_constraint_is_a_400(served, monkeypatch):
    served, _ = served
    import sys

    from lmforge.generation import constraints

    monkeypatch.setitem(sys.modules, "llguidance", None)  # import llguidance fails
    constraints.engine.cache_clear()
    try:
        r = post(served, response_format={"type": "json_object"})
        assert r.status_code == 400 and "pip install 'lmforge[grammar]'" in r.json()["error"]["message"]
        assert r.json()["error"]["param"] == "response_format"
        assert answer(post(served))[1] in ("stop", "length")  # free requests are served as before
    finally:
        constraints.engine.cache_clear()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="stops the server through Linux's /proc")
def test_the_split_server_carries_constraints_to_its_engine(tmp_path):
    """``lmforge serve --http-process``: the constraint crosses the pipe; constrained and free replies together."""
    from test_serve_split import start, stop

    proc, url = start(chat_model(tmp_path / "chat-model"), "--slots", "4")
    try:
        formats = [{"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}, None,
                   {"type": "choice", "choice": CHOICES}, None]
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda f: answer(post(url, **({"response_format": f} if f else {}))), formats))
        assert [reason for _, reason in answers[::2]] == ["stop", "stop"]
        jsonschema.validate(json.loads(answers[0][0]), PERSON)
        assert answers[2][0] in CHOICES and answers[1] == answers[3]
        assert post(url, response_format={"type": "regex", "regex": "("}).json()["error"]["param"] == \
            "response_format.regex"
    finally:
        stop(proc)


# -- SmolLM2 through the official openai client (slow) -----------------------------------------------------------
@pytest.mark.slow
def test_smollm2_structured_output_through_the_openai_client():
    openai = pytest.importorskip("openai", reason="the official client (dev extra)")
    from pydantic import BaseModel

    from lmforge.data.sources import smollm2_path
    from serve_helpers import live_server

    class City(BaseModel):  # no float: SmolLM2 writes a number's digits until max_tokens
        name: str
        country: str
        is_capital: bool

    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 40},
                                               "continent": {"enum": ["Europe", "Asia", "Africa", "America"]}},
              "required": ["capital", "continent"], "additionalProperties": False}
    with live_server(smollm2_path(), slots=4) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        question = [{"role": "user", "content": "What is the capital of France? Answer in JSON."}]
        out = client.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=question, temperature=0,
                                             max_tokens=60, response_format={"type": "json_schema", "json_schema": {
                                                 "name": "capital", "schema": schema, "strict": True}})
        assert out.choices[0].finish_reason == "stop"
        answer_ = json.loads(out.choices[0].message.content)
        jsonschema.validate(answer_, schema)
        assert answer_["capital"] == "Paris"
        parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
        parsed = parse(model="SmolLM2-135M-Instruct.Q4_1", response_format=City, temperature=0, max_tokens=80,
                       messages=[{"role": "user", "content": "Describe Paris as JSON."}])
        assert parsed.choices[0].message.parsed == City(name="Paris", country="FRANCE", is_capital=True)
