"""Declared once (issue 36): the decoding settings' ranges live in ``GenerateOptions`` and both the Python check
(``check_decoding``) and the HTTP request models (``serve/schemas.py``) derive from them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from lmforge.errors import LmforgeError
from lmforge.generation.options import SEED_RANGE, GenerateOptions, check_decoding

LOW, HIGH = SEED_RANGE
# (setting, value, the Python API accepts it, the HTTP API accepts it): every bound of every decoding setting the
# HTTP API takes, just inside and just outside. Where the two differ, the field's ``api`` declares OpenAI's range.
BOUNDARIES = [
    ("max_new_tokens", -1, False, False), ("max_new_tokens", 0, True, False), ("max_new_tokens", 1, True, True),
    ("temperature", -1e-9, False, False), ("temperature", 0.0, True, True), ("temperature", 2.0, True, True),
    ("temperature", 2.0 + 1e-9, True, False), ("temperature", math.nan, False, False),
    ("temperature", math.inf, False, False),
    ("top_k", 0, False, False), ("top_k", 1, True, True),
    ("top_p", 0.0, False, False), ("top_p", 1e-9, True, True), ("top_p", 1.0, True, True),
    ("top_p", 1.0 + 1e-9, False, False), ("top_p", math.nan, False, False),
    ("repetition_penalty", 0.0, False, False), ("repetition_penalty", 1e-9, True, True),
    ("repetition_penalty", math.inf, False, False),
    ("seed", LOW - 1, False, False), ("seed", LOW, True, True), ("seed", HIGH, True, True),
    ("seed", HIGH + 1, False, False),
    ("stop", [], True, True), ("stop", ["a"] * 32, True, True), ("stop", ["a"] * 33, True, False),
    ("stop", ["a" * 256], True, True), ("stop", ["b", "a" * 257], False, False),
    ("stop", [""], False, False), ("stop", ["a", ""], False, False),
]
WIRE = {"max_new_tokens": ["max_tokens", "max_completion_tokens"]}  # OpenAI's names; the rest keep theirs
NOT_ON_THE_API = {"beams", "length_penalty", "batch_size", "compile"}  # lmforge's own: generate, translate


def http_accepts(name: str, value: object) -> bool:
    """Whether a chat request with this one setting is accepted, under each of its wire names alike."""
    pytest.importorskip("pydantic", reason="the HTTP request models need the serve extra (pydantic)")
    from pydantic import ValidationError

    from lmforge.serve.schemas import ChatRequest

    verdicts = set()
    for wire in WIRE.get(name, [name]):
        try:
            ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], wire: value})
            verdicts.add(True)
        except ValidationError as err:
            assert err.errors()[0]["loc"][0] == wire, err  # the 400 names the field
            verdicts.add(False)
    assert len(verdicts) == 1, f"{name}'s wire names disagree at {value!r}"
    return verdicts.pop()


def python_accepts(name: str, value: object) -> bool:
    try:
        check_decoding(**{"stop_strings" if name == "stop" else name: value})
        return True
    except LmforgeError as err:
        assert str(err).startswith("stop_strings" if name == "stop" else name) and "\n" not in str(err)
        return False


@pytest.mark.parametrize(("name", "value", "python", "http"), BOUNDARIES)
def test_the_python_check_and_the_http_model_agree_on_every_boundary(name, value, python, http):
    assert (python_accepts(name, value), http_accepts(name, value)) == (python, http)


def test_every_decoding_setting_with_a_range_is_probed_at_its_bounds():
    """A setting added to the schema with a range (or an ``api`` range) must join BOUNDARIES, or say it is not on
    the HTTP API; where the surfaces differ, the difference is declared in the field's ``api``."""
    probed = {name for name, *_ in BOUNDARIES}
    for f in dataclasses.fields(GenerateOptions):
        rules = [k for k in ("min", "max", "above", "below", "nonempty", "max_items", "max_chars")
                 if f.metadata.get(k)]
        if f.name not in NOT_ON_THE_API and (rules or f.metadata["api"]):
            assert f.name in probed, f"{f.name}: add its bounds to BOUNDARIES"
    differ = {name for name, _, python, http in BOUNDARIES if python != http}
    declared = {f.name for f in dataclasses.fields(GenerateOptions) if f.metadata["api"]}
    assert differ == declared == {"max_new_tokens", "temperature", "stop"}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"temperature": -1.0}, "temperature: must be >= 0, got -1.0"),
    ({"top_k": 0}, "top_k: must be >= 1, got 0"),
    ({"top_p": 1.5}, "top_p: must be <= 1, got 1.5"),
    ({"beams": 0}, "beams: must be >= 1, got 0"),
    ({"repetition_penalty": 0.0}, "repetition_penalty: must be > 0, got 0.0"),
    ({"seed": 2**64}, f"seed: must be <= {2**64 - 1}, got {2**64}"),
    ({"stop_strings": "END"}, "stop_strings: expected a list, got 'END'"),  # not three one-letter stops
    ({"temperature": "0.5"}, "temperature: expected a number, got '0.5'"),
    ({"beams": 2, "temperature": 0.7}, "beams: beam search is deterministic"),
    ({"beams": 2, "repetition_penalty": 1.2}, "repetition_penalty: works with greedy decoding and sampling"),
    ({"beams": 2, "stop_strings": ["."]}, "stop_strings: beam search ends on stop tokens only"),
    ({"top_kk": 5}, "top_kk: unknown decoding setting; did you mean top_k"),
])
def test_check_decoding_says_what_a_flag_says_in_one_line(kwargs, message):
    with pytest.raises(LmforgeError) as err:
        check_decoding(**kwargs)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_check_decoding_types_the_values_and_lets_none_through():
    np = pytest.importorskip("numpy", reason="a NumPy number is one of the values it reads")
    typed = check_decoding(temperature=1, top_k=np.int64(5), top_p=None, stop_strings=("a",), max_new_tokens=3)
    assert typed == {"temperature": 1.0, "top_k": 5, "top_p": None, "stop_strings": ["a"], "max_new_tokens": 3}
    assert type(typed["temperature"]) is float and type(typed["top_k"]) is int
