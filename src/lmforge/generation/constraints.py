"""Constrained decoding: a reply forced to match a JSON schema, any JSON object, a regular expression or one of
a list of strings, by a grammar engine's token masks applied per row inside the batched step.

    c = Constraint.json_schema({"type": "object", ...})          # plain data: pickles, compares, hashes
    engine.submit(Request(ids, constraint=c))                      # a constrained row beside free ones

Each step, before a token is chosen, the rows whose requests carry a constraint have their logits set to -inf
outside the tokens the grammar allows next (``RowConstraints.apply``: the grammar engine fills one bitmask of
V / 32 words a row, unpacked and applied in one call to those rows only; free rows cost nothing). The chosen token
advances the row's grammar state (``note``). Once the grammar may end, the request's stop tokens are allowed; once
it must end, only they are: the reply ends with "stop" and its text matches. A reply cut by ``max_new_tokens``
ends with "length" and may be incomplete, as OpenAI's.

The grammar engine is llguidance (chosen by measurement: bench/grammar_engines.py, docs/serving.md): it builds its
parser lazily, so a new schema costs under a millisecond, not a compile over the vocabulary, and a mask takes tens
of microseconds. It is an optional dependency (``pip install lmforge[grammar]``); without it a constrained request
is refused with one line.

JSON is written in one fixed layout: ``{"a": 1, "b": [true, null]}`` (", " and ": " between items, no other
whitespace), so that no model can loop on whitespace. ``Constraint.lark`` takes any llguidance Lark grammar, which
may embed a JSON schema after free text (``start: TEXT "<tool_call>" %json {...}``): the shape tool calls need.
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.generation.slots import upload
from lmforge.tokenizers.byte_bpe import ByteLevelBPETokenizer, token_bytes

# OpenAI's JSON layout, the same for every schema (llguidance's "x-guidance" options)
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
INSTALL = "install the grammar engine: pip install 'lmforge[grammar]' (llguidance)"


@dataclass(frozen=True)
class Constraint:
    """What a reply must match: ``kind`` (json_schema | json_object | regex | choice | lark) and its ``spec`` as
    text (the schema as JSON, the regular expression, the choices as a JSON list, the grammar); ``field`` names it
    in errors (``response_format``). Plain data, so that a request carrying it crosses a process's pipe."""

    kind: str
    spec: str
    field: str = "response_format"

    @classmethod
    def json_schema(cls, schema: dict[str, Any] | bool, field: str = "response_format.json_schema.schema"):
        return cls("json_schema", json.dumps({} if schema is True else schema), field)  # true: any JSON

    @classmethod
    def json_object(cls, field: str = "response_format"):
        return cls("json_object", '{"type": "object"}', field)

    @classmethod
    def regex(cls, pattern: str, field: str = "response_format.regex"):
        return cls("regex", pattern, field)

    @classmethod
    def choice(cls, choices: Sequence[str], field: str = "response_format.choice"):
        return cls("choice", json.dumps(list(choices)), field)

    @classmethod
    def lark(cls, grammar: str, field: str = "grammar"):
        return cls("lark", grammar, field)

    def grammar(self) -> str:
        """The llguidance grammar of this constraint (checked by ``check``)."""
        ll = engine()
        if self.kind in ("json_schema", "json_object"):
            schema = json.loads(self.spec)
            try:
                return ll.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT)
            except (ValueError, TypeError) as err:
                raise LmforgeError(f"{self.field}: {err}") from None
        if self.kind == "regex":
            return ll.LLMatcher.grammar_from_regex(self.spec)
        if self.kind == "choice":
            return ll.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(c) for c in
                                                                         json.loads(self.spec)))
        if self.kind == "lark":
            return ll.LLMatcher.grammar_from_lark(self.spec)
        raise LmforgeError(f"{self.field}: unknown constraint kind {self.kind!r}")


@functools.cache
def engine() -> Any:
    """The llguidance module, or one line saying how to install it."""
    try:
        import llguidance
    except ImportError:
        raise LmforgeError(f"response_format: constrained decoding needs llguidance; {INSTALL}") from None
    return llguidance


def check(constraint: Constraint, tokenizer: Any) -> None:
    """A constraint this engine can serve, or one line naming its field: the grammar engine installed, a byte-level
    tokenizer, a grammar that compiles (a bad schema or regex: llguidance's own words)."""
    grammar = constraint.grammar()
    if not isinstance(tokenizer, ByteLevelBPETokenizer):
        raise LmforgeError(f"{constraint.field}: constrained decoding needs a byte-level BPE tokenizer (this model's "
                           f"is {type(tokenizer).__name__})")
    error = engine().LLMatcher.validate_grammar(grammar, None)
    if error:
        raise LmforgeError(f"{constraint.field}: {first_line(error)}")


def first_line(message: str) -> str:
    return message.strip().splitlines()[0][:300] if message.strip() else "invalid"


def vocabulary_bytes(tokenizer: Any) -> list[bytes]:
    """Each token's bytes in the text, by id (a special token's: its name; the grammar never allows one)."""
    return [token_bytes(tokenizer, i) for i in range(tokenizer.vocab_size)]


_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grammar_tokenizer(tokenizer: Any, vocab: int) -> Any:
    """llguidance's tokenizer of ``tokenizer``, its ids padded to the model's ``vocab`` (made once per tokenizer:
    ~0.2 s for SmolLM2's 49,152 tokens, paid by the first constrained request)."""
    held = _TOKENIZERS.get(tokenizer)
    if held is None or held[0] != vocab:
        ll = engine()
        tokens = vocabulary_bytes(tokenizer)
        tokens += [b"<|unused|>"] * (vocab - len(tokens))
        specials = sorted({*tokenizer.special_ids, *range(tokenizer.vocab_size, vocab)})
        eos = tokenizer.eos_id if tokenizer.eos_id is not None else specials[0]
        wrapper = _Wrapper(tokens, specials, eos, tokenizer)
        held = vocab, ll.LLTokenizer(ll.TokenizerWrapper(wrapper))
        _TOKENIZERS[tokenizer] = held
    return held[1]


class _Wrapper:
    """What llguidance's ``TokenizerWrapper`` reads: the tokens' bytes, the special ids, the end token, and the
    tokenizer itself (it tokenizes the bytes a grammar forces, to keep them to the tokens the model would see)."""

    def __init__(self, tokens: list[bytes], specials: list[int], eos: int, tokenizer: Any) -> None:
        self.tokens, self.special_token_ids, self.eos_token_id, self.bos_token_id = tokens, specials, eos, None
        self.tokenizer = tokenizer

    def __call__(self, text: bytes) -> list[int]:
        return self.tokenizer.encode(text.decode("utf-8", errors="replace"), add_special_tokens=False).ids


class RowConstraints:
    """The grammar state of each of a runner's ``rows`` slots (None: free), over a model of ``vocab`` tokens, and
    the masks of a step. The engine hands it its tokenizer and default stop tokens (``use``)."""

    def __init__(self, rows: int, vocab: int) -> None:
        self.vocab, self.words = vocab, (vocab + 31) // 32
        self.matchers: list[Any | None] = [None] * rows
        self.stops: list[tuple[int, ...]] = [()] * rows
        self.bits = torch.zeros(rows, self.words, dtype=torch.int32)  # (S, V/32): bit b of word w is token 32w + b
        self.bit = torch.tensor([1 << b for b in range(31)] + [-(1 << 31)], dtype=torch.int32)  # (32,) as int32
        self.bit_on: dict[torch.device, torch.Tensor] = {}  # the same on each device used
        self.tokenizer: Any = None
        self.default_stops: tuple[int, ...] = ()
        self.end_id = 0  # the grammar engine's end token: allowed when the grammar may end

    def use(self, tokenizer: Any, stops: Sequence[int]) -> None:
        self.tokenizer, self.default_stops = tokenizer, tuple(stops)

    def begin(self, i: int, constraint: Constraint | None, stops: Sequence[int] | None) -> None:
        """Slot i's grammar from its start (None: a free request). Never raises: the constraint was checked when
        submitted, and a matcher that fails later allows only the stop tokens."""
        if constraint is None:
            self.matchers[i] = None
            return
        ll, tokenizer = engine(), grammar_tokenizer(self.tokenizer, self.vocab)
        self.matchers[i] = ll.LLMatcher(tokenizer, constraint.grammar(), log_level=0)
        self.stops[i] = tuple(stops) if stops is not None else self.default_stops
        self.end_id = tokenizer.eos_token

    def note(self, i: int, token: int) -> None:
        """Slot i's grammar advances by ``token`` (a stop token ends the request instead)."""
        m = self.matchers[i]
        if m is not None and token not in self.stops[i]:
            m.consume_token(token)

    @staticmethod
    def set_bit(words: torch.Tensor, token: int, on: bool) -> None:
        """Token ``token``'s bit in a row of mask words (V/32,) int32, set or cleared (on the host)."""
        word, bit = divmod(token, 32)
        value = int(words[word]) & 0xFFFFFFFF
        value = value | (1 << bit) if on else value & ~(1 << bit)
        words[word] = value - (1 << 32) if value >= 1 << 31 else value

    def move(self, src: int, dst: int) -> None:
        self.matchers[dst], self.stops[dst] = self.matchers[src], self.stops[src]

    def apply(self, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """The logits (R, V) of ``slots`` with each constrained row's disallowed tokens at -inf (a new tensor; the
        same one when no row is constrained): the grammar engine fills a bitmask per row, the bits
        become a (n, V) mask, and the rows where the grammar may end allow their request's stop tokens instead of
        the grammar engine's end token."""
        rows = [k for k, i in enumerate(slots) if self.matchers[i] is not None]
        if not rows:
            return logits
        n, matchers = len(rows), [self.matchers[slots[k]] for k in rows]
        bits = self.bits[:n]  # (n, V/32)
        for r, m in enumerate(matchers):  # on this thread: a pool's threads would spin beside the model's
            m.unsafe_compute_mask_ptr(bits[r].data_ptr(), self.words * 4)
        end, shift = divmod(self.end_id, 32)
        ends = [bool((word >> shift) & 1) or m.is_error() for word, m in zip(bits[:, end].tolist(), matchers,
                                                                              strict=True)]
        for r, k in enumerate(rows):  # the engine's end token never; the request's stops where the grammar may end
            self.set_bit(bits[r], self.end_id, False)
            for stop in self.stops[slots[k]]:
                self.set_bit(bits[r], stop, ends[r])
        device = logits.device
        if device not in self.bit_on:
            self.bit_on[device] = self.bit.to(device)
        allowed = upload(bits, device)[:, :, None] & self.bit_on[device]  # (n, V/32, 32), copied without a sync
        banned = (allowed == 0).reshape(n, -1)[:, : logits.shape[-1]]  # (n, V)
        index = upload(rows, device)
        masked = logits.index_select(0, index).masked_fill_(banned, float("-inf"))
        return logits.index_copy(0, index, masked)
