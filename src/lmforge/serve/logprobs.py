"""Log-probabilities in OpenAI's two shapes, from the engine's (``Generation.logprobs``: the chosen token's
log-probability under the model's own distribution and the top alternatives, computed from the row's logits).

    chat:         "logprobs": {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", ...}]}, ...]}
    completions:  "logprobs": {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}],
                               "text_offset": [...]}          (the prompt's first token, echoed: null)

A token's text is its bytes read as UTF-8 (a byte-level token that holds part of a character reads as U+FFFD;
``bytes`` gives the bytes themselves, as OpenAI does). A chat reply does not list the tokens that ended it (end of
turn, end of text: not part of its text); a completion lists every token it generated (lm-evaluation-harness
reads an echoed prompt's columns up to the last, the one generated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmforge.tokenizers.byte_bpe import token_bytes

Logprob = tuple[float, tuple[tuple[int, float], ...]]


def token_text(tokenizer: Any, token: int) -> str:
    """A token's text: its bytes read as UTF-8 (part of a character reads as U+FFFD)."""
    return token_bytes(tokenizer, token).decode("utf-8", errors="replace")


def shown(tokens: Sequence[int], logprobs: Sequence[Logprob], stops: Sequence[int]) -> list[tuple[int, Logprob]]:
    """The (token, log-probability) pairs of a reply's text: without the tokens that ended it."""
    stop = set(stops)
    return [(t, lp) for t, lp in zip(tokens, logprobs, strict=False) if t not in stop]


def chat_content(tokenizer: Any, pairs: Sequence[tuple[int, Logprob]]) -> list[dict[str, Any]]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        return {"token": token_text(tokenizer, token), "logprob": logprob, "bytes": list(token_bytes(tokenizer, token))}

    return [entry(t, lp) | {"top_logprobs": [entry(a, alp) for a, alp in tops]} for t, (lp, tops) in pairs]


def completion_columns(tokenizer: Any, pairs: Sequence[tuple[int, Logprob | None]], offset: int = 0) -> dict[str, Any]:
    """The legacy columns; ``offset``: the characters before the first token (the echoed prompt's length)."""
    out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token, logprob in pairs:
        text = token_text(tokenizer, token)
        out["tokens"].append(text)
        out["token_logprobs"].append(None if logprob is None else logprob[0])
        tops = None if logprob is None else {token_text(tokenizer, a): alp for a, alp in logprob[1]}
        out["top_logprobs"].append(tops)
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def joined(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two runs of columns as one (an echoed prompt's, then its completion's)."""
    return {key: first[key] + second[key] for key in first}
