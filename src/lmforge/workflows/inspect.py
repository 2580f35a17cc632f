"""Run a model on one text and keep what it looked at: every layer's and head's attention, and its rollout.

Any model ``lmforge.load`` returns works: BERT-like encoders (lmforge's or Hugging Face's, e.g. the real
all-MiniLM-L6-v2), GPT-like decoders, and encoder-decoders, whose three kinds of attention (encoder
self, decoder self, cross) are kept apart as *views*::

    >>> model, tok = lmforge.load(minilm_path())                                  # doctest: +SKIP
    >>> maps = attention_maps(model, tok, "Juventus lost from Ajax")              # doctest: +SKIP
    >>> view = maps.views["encoder"]                                              # doctest: +SKIP
    >>> view.queries                                                              # doctest: +SKIP
    ['[CLS]', 'juventus', 'lost', 'from', 'ajax', '[SEP]']
    >>> view.weights.shape          # (layers, heads, queries, keys); each row sums to 1   # doctest: +SKIP
    (6, 12, 6, 6)

Attention rollout (Abnar & Zuidema 2020) follows attention through the layers, counting the residual
connection as attention to oneself: average the heads, add the identity, renormalise each row, multiply::

    Ã_l = rownorm(mean_h A_l + I)             R = Ã_L · Ã_{L-1} · ... · Ã_1

Row i of R says how much of token i's top-layer representation comes from each input token.

    >>> a = np.array([[[[1.0, 0.0], [1.0, 0.0]]]])     # one layer, one head: both tokens read token 0
    >>> attention_rollout(a)                            # (A + I) / 2 row by row
    array([[1. , 0. ],
           [0.5, 0.5]])
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.viz.views import AttentionMaps, AttentionView


def backbone(model: nn.Module) -> nn.Module:
    """The Encoder, Decoder or Seq2Seq inside ``model`` (a task model's ``.encoder``, a wrapper's ``.model``)."""
    from lmforge.models import Decoder, Encoder, Seq2Seq

    seen = model
    for _ in range(4):
        if isinstance(seen, Encoder | Decoder | Seq2Seq):
            return seen
        inner = getattr(seen, "encoder", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(seen, "model", None)
        if not isinstance(inner, nn.Module):
            break
        seen = inner
    raise LmforgeError(f"--model: a {type(model).__name__} holds no Encoder, Decoder or Seq2Seq to inspect")


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def token_labels(tokenizer: Any, ids: list[int]) -> list[str]:
    """Readable token strings; byte-level BPE's markers Ġ (space) and Ċ (newline) become ␣ and ⏎."""
    tokens = tokenizer.convert_ids_to_tokens(ids)
    if getattr(tokenizer, "kind", "") != "byte-bpe":
        return tokens
    return [t.replace("Ġ", "␣").replace("Ċ", "⏎") for t in tokens]


def source_ids(tokenizer: Any, text: str, max_positions: int) -> list[int]:
    """The ids a model reads for ``text`` (special tokens added as in training), cut to ``max_positions``."""
    ids = tokenizer.encode(text).ids
    if not ids:
        raise LmforgeError("--text: the text is empty (no tokens)")
    if len(ids) > max_positions:
        print(f"lmforge: the text has {len(ids)} tokens; the model reads the first {max_positions}", file=sys.stderr)
    return ids[:max_positions]


def _stack(per_layer: tuple[torch.Tensor, ...]) -> np.ndarray:
    """L tensors (1, H, Tq, Tk) -> (L, H, Tq, Tk) float32 on the CPU."""
    return torch.cat([a.float().cpu() for a in per_layer], dim=0).numpy()


def attention_maps(model: nn.Module, tokenizer: Any, text: str, target: str | None = None,
                   max_new_tokens: int = 16, ids: list[int] | None = None) -> AttentionMaps:
    """Attention weights of ``model`` on ``text``, every layer and head, through the explicit attention path.

    For an encoder-decoder, ``target`` is what the decoder reads (after its start token); without it the
    model writes its own greedy continuation of up to ``max_new_tokens`` tokens first. ``ids``: the text's
    tokens when the caller has them (a chat template's rendering), instead of tokenizing ``text``.
    """
    from lmforge.models import Decoder, Seq2Seq
    from lmforge.models.interfaces import special_ids

    core = backbone(model).eval()
    config = core.config
    device = device_of(core)
    ids = source_ids(tokenizer, text, config.max_positions) if ids is None else ids[: config.max_positions]
    x = torch.tensor([ids], device=device)  # (1, T)
    labels = token_labels(tokenizer, ids)
    name = type(core).__name__
    with torch.inference_mode():
        if not isinstance(core, Seq2Seq):
            out = core(x, output_attentions=True)
            view = "decoder" if isinstance(core, Decoder) else "encoder"
            weights = _stack(out.attentions)
            return AttentionMaps(name, text, {view: AttentionView(view, labels, labels, weights, view == "decoder")})
        enc = core.encode(x, output_attentions=True)
        start = special_ids(core, tokenizer).decoder_start
        if target is None:
            from lmforge.generation import generate

            new = generate(core, x, max_new_tokens=max_new_tokens).to_lists()[0]
            tgt = [start, *new]
            target = tokenizer.decode(new, skip_special_tokens=True)
        else:
            tgt = [start, *tokenizer.encode(target, add_special_tokens=False).ids]
        tgt = tgt[: config.max_positions]
        dec = core.decode(torch.tensor([tgt], device=device), enc.last_hidden_state, output_attentions=True)
    tgt_labels = token_labels(tokenizer, tgt)
    views = {
        "encoder": AttentionView("encoder", labels, labels, _stack(enc.attentions)),
        "decoder": AttentionView("decoder", tgt_labels, tgt_labels, _stack(dec.attentions), causal=True),
        "cross": AttentionView("cross", tgt_labels, labels, _stack(dec.cross_attentions)),
    }
    return AttentionMaps(name, text, views, target)


def attention_rollout(weights: np.ndarray, residual: bool = True) -> np.ndarray:
    """Abnar & Zuidema's rollout of self-attention ``weights`` (L, H, T, T) -> (T, T), rows summing to 1.

    Each layer: average the heads, add the identity for the residual connection (``residual=False``
    skips it), renormalise the rows; then multiply the layers, the lowest one rightmost.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise LmforgeError(f"rollout needs self-attention weights (L, H, T, T), got shape {w.shape}")
    t = w.shape[-1]
    rollout = np.eye(t)  # (T, T): before any layer every token is itself
    for layer in w:
        a = layer.mean(axis=0)  # (T, T): heads averaged
        if residual:
            a = a + np.eye(t)
        a = a / np.maximum(a.sum(axis=-1, keepdims=True), 1e-12)  # rows sum to 1 again
        rollout = a @ rollout  # (T, T)
    return rollout
