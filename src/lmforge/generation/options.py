"""The settings of decoding, declared once (``lmforge.schema``): flags of ``lmforge generate`` / ``translate`` /
``chat`` / ``serve``, keys of their ``--config`` files, the keyword arguments of ``generate`` (``check_decoding``)
and the sampling fields of the HTTP API's requests (``serve/schemas.py``), each range written here only.

No torch here: the command line reads these fields at start-up.

    >>> options = GenerateOptions(temperature=0.8, top_k=40)
    >>> options.sampling()["temperature"], options.sampling()["top_k"]
    (0.8, 40)
    >>> check_decoding(top_p=1.5)
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: top_p: must be <= 1, got 1.5

Where the HTTP API accepts other values than the rest it says so in the field's ``api`` (OpenAI's ranges:
temperature <= 2, at least 1 new token, at most 32 stop strings); ``schema.api_rules`` reads them.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.schema import check_range, parse, setting, unknown

SEED_RANGE = (-(2**63), 2**64 - 1)  # what a torch.Generator takes


@dataclass
class DecodeOptions:
    """How hypotheses are searched and batched (``lmforge translate`` has only these)."""

    beams: int = setting(1, "beam search with B beams (1: off)", min=1, metavar="B")
    length_penalty: float = setting(1.0, "beam score = log p / length**L", metavar="L")
    batch_size: int = setting(8, "inputs decoded together, left-padded", min=1, metavar="N")


@dataclass
class GenerateOptions(DecodeOptions):
    """Greedy decoding, sampling (temperature, top-k, top-p) or beams; stops by token or string."""

    max_new_tokens: int = setting(50, "most tokens to add", min=0, metavar="N", api={"min": 1})
    temperature: float | None = setting(None, "0 = greedy; > 0 samples from softmax(logits / T) (default 0, or 1 "
                                        "when top_k or top_p is given)", min=0, metavar="T", api={"max": 2})
    top_k: int | None = setting(None, "sample among the K most likely tokens only", min=1, metavar="K")
    top_p: float | None = setting(None, "sample among the smallest set with probability >= P", above=0, max=1,
                                  metavar="P")
    repetition_penalty: float = setting(1.0, "> 1 makes tokens already in the text less likely (CTRL; 1: off)",
                                        above=0, metavar="R")
    seed: int | None = setting(None, "random seed: the same seed gives the same sample", min=SEED_RANGE[0],
                               max=SEED_RANGE[1], metavar="S")
    stop: list[str] = setting(factory=list, help="end the text once it holds STRING (kept; not with beams)",
                              nonempty=True, max_chars=256, metavar="STRING", api={"max_items": 32})
    compile: bool | None = setting(None, "one compiled fixed-shape step per token (default: on for CUDA)")

    def validate(self, section: str = "generate") -> None:
        check_beams(self.beams, self.resolved_temperature(), self.top_k, self.top_p, self.repetition_penalty,
                    self.stop, f"{section}.")

    def resolved_temperature(self) -> float:
        """0 unless given; top-k / top-p filter a distribution to sample from, so alone they imply T = 1."""
        if self.temperature is None:
            return 1.0 if (self.top_k or self.top_p) else 0.0
        return self.temperature

    def sampling(self) -> dict[str, Any]:
        """The keyword arguments of ``generate`` / ``stream`` these options stand for."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.resolved_temperature(),
                "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed, "compile": self.compile,
                "repetition_penalty": self.repetition_penalty, "stop_strings": list(self.stop)}


SETTINGS = {f.name: f for f in dataclasses.fields(GenerateOptions)}
HINTS = typing.get_type_hints(GenerateOptions)
PYTHON_NAMES = {"stop_strings": "stop"}  # generate()'s keyword -> the field it is


def check_decoding(**values: Any) -> dict[str, Any]:
    """The keyword arguments of ``generate`` / ``stream`` checked against their declarations above, as a flag or
    a config key is (type, finite numbers, range: one line naming the keyword), then the rules across settings
    (``check_beams``). Returns the values typed (``temperature=1`` -> 1.0); None passes (off / default).

    Names: the fields of ``GenerateOptions`` (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``,
    ``repetition_penalty``, ``seed``, ``beams``, ``length_penalty``, ...), and ``stop_strings`` for ``stop``.
    A NumPy number (or a 0-d tensor) counts as the Python number it holds.

    >>> check_decoding(max_new_tokens=8, temperature=1, top_k=40, top_p=0.9, stop_strings=["\\n"])["temperature"]
    1.0
    >>> check_decoding(beams=2, temperature=0.7)
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: beams: beam search is deterministic; use it with temperature 0 and no top_k/top_p
    """
    typed = {}
    for name, value in values.items():
        f = SETTINGS.get(PYTHON_NAMES.get(name, name))
        if f is None:
            raise unknown(name, name, [*SETTINGS, *PYTHON_NAMES], "decoding setting")
        if value is None:
            typed[name] = None
            continue
        if hasattr(value, "item") and not isinstance(value, int | float):  # np.int64(5), torch.tensor(0.7)
            value = value.item()
        typed[name] = parse(value, HINTS[f.name], name)
        check_range(typed[name], f.metadata, name)
    stop_key = "stop_strings" if "stop_strings" in typed else "stop"
    check_beams(typed.get("beams") or 1, typed.get("temperature") or 0.0, typed.get("top_k"), typed.get("top_p"),
                typed.get("repetition_penalty", 1.0), typed.get(stop_key), stop_key=stop_key)
    return typed


def check_beams(beams: int, temperature: float, top_k: int | None, top_p: float | None, repetition_penalty: float,
                stop: Sequence[str] | None, prefix: str = "", stop_key: str = "stop") -> None:
    """Beam search keeps the K most likely hypotheses: no sampling, no repetition penalty, no stop strings (it
    ends on stop tokens). ``prefix`` names the section (``"generate."``) where the values come from a recipe."""
    if beams <= 1:
        return
    if repetition_penalty != 1.0:
        raise LmforgeError(f"{prefix}repetition_penalty: works with greedy decoding and sampling, not with beam "
                           "search")
    if temperature > 0 or top_k is not None or top_p is not None:
        raise LmforgeError(f"{prefix}beams: beam search is deterministic; use it with temperature 0 and no "
                           "top_k/top_p")
    if stop:
        raise LmforgeError(f"{prefix}{stop_key}: beam search ends on stop tokens only; use greedy or sampling")
