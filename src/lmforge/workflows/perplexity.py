"""How well a language model predicts a text: perplexity, and bits per character and per byte.

The text is tokenized as pretraining tokenized it (line breaks kept, ``encode_lines``) and scored in windows
of the model's context, each window sliding by ``stride`` tokens; a token is scored once, in the first window
where it has the most context (the standard sliding-window evaluation)::

    NLL = - Σ_t ln p(x_t | x_<t)              over the N scored tokens
    perplexity = exp(NLL / N)                 per token: depends on the tokenizer
    bits per character = NLL / (ln 2 · C)     per character of the text: comparable across tokenizers
    bits per byte = NLL / (ln 2 · B)          per UTF-8 byte

The first token of the text has no context and is not scored (N = tokens - 1).

    >>> report = perplexity(model, tokenizer, open("hamlet.txt").read())      # doctest: +SKIP
    >>> report["perplexity"], report["bits_per_character"]                     # doctest: +SKIP
    (4.91, 1.93)
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError


@torch.inference_mode()
def perplexity(model: nn.Module, tokenizer: Any, text: str, stride: int | None = None,
               batch_size: int = 8) -> dict[str, Any]:
    """Perplexity and bits per character / byte of ``text`` under a causal LM (see the module docstring)."""
    from lmforge.data.corpus import encode_lines
    from lmforge.models.decoder import Decoder

    if not isinstance(model, Decoder):
        raise LmforgeError(f"a {type(model).__name__} is not a causal language model: perplexity needs a decoder "
                           "(a GPT); a classifier is evaluated on a labeled file instead")
    lines = text.split("\n")
    ids = [int(t) for piece in encode_lines(tokenizer, lines[:-1]) for t in piece]
    if lines[-1]:
        ids.extend(int(t) for t in encode_lines(tokenizer, [lines[-1]], line_breaks=False)[0])
    if len(ids) < 2:
        raise LmforgeError("the text has fewer than two tokens: nothing to score")
    window = model.config.max_positions
    stride = min(stride or window // 2, window)
    device = next(model.parameters()).device
    tokens = torch.tensor(ids, device=device)  # (N,)
    starts, scored_from = _windows(len(ids), window, stride)
    model.eval()
    total, counted = 0.0, 0
    for first in range(0, len(starts), batch_size):
        rows = list(zip(starts[first:first + batch_size], scored_from[first:first + batch_size], strict=True))
        width = max(min(window, len(ids) - s) for s, _ in rows)
        batch = torch.zeros(len(rows), width, dtype=torch.long, device=device)  # (B, T)
        labels = torch.full_like(batch, -100)  # (B, T): next-token targets where this window scores them
        for r, (s, keep) in enumerate(rows):
            piece = tokens[s:s + width]
            batch[r, : len(piece)] = piece
            labels[r, keep - s: len(piece)] = piece[keep - s:]
        logits = model(batch).logits.float()  # (B, T, V)
        nll = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), reduction="sum",
                                          ignore_index=-100)
        total += float(nll)
        counted += int((labels[:, 1:] != -100).sum())
    characters, n_bytes = len(text), len(text.encode("utf-8"))
    return {"tokens": len(ids), "scored_tokens": counted, "characters": characters, "bytes": n_bytes,
            "nll_per_token": total / counted, "perplexity": math.exp(total / counted),
            "bits_per_character": total / math.log(2) / characters,
            "bits_per_byte": total / math.log(2) / n_bytes, "window": window, "stride": stride}


def _windows(n: int, window: int, stride: int) -> tuple[list[int], list[int]]:
    """Window starts, and from which position each window scores (positions before it were scored earlier).

    >>> _windows(10, 4, 2)     # windows [0,4) [2,6) [4,8) [6,10); each scores what the one before did not
    ([0, 2, 4, 6], [1, 4, 6, 8])
    >>> _windows(8, 4, 4)      # no overlap: a window's first token has no context and is not scored
    ([0, 4], [1, 5])
    """
    starts, scored_from = [0], [1]
    while starts[-1] + window < n:
        start = starts[-1] + stride
        starts.append(start)
        scored_from.append(max(starts[-2] + window, start + 1))  # the first token of a window has no context
    return starts, scored_from
