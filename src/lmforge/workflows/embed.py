"""Embeddings out of any model: contextual sentence vectors, and word vectors from the input embeddings.

Contextual (``embed``): run the texts in padded batches, take one layer's hidden states (the last by
default, ``layer=L`` for hidden_states[L], 0 being the embeddings) or ELMo's scalar mix of all of them,
then pool the tokens into one vector per text::

    mean   sum_t m_t h_t / sum_t m_t    m = attention mask (padding never counts), optionally 0 on [CLS]/[SEP]
    cls    h_0                          the first token ([CLS] for BERT)
    last   h_{T-1}                      the last real token (what a GPT has read everything up to)

Mean pooling of MiniLM's last layer over the attention mask is exactly sentence-transformers' recipe:

    >>> model, tok = lmforge.load(minilm_path())                                    # doctest: +SKIP
    >>> embed(model, tok, ["Juventus lost from Ajax", "Ajax won"]).shape          # doctest: +SKIP
    (2, 384)

The same queries work on sentences: ``rank_texts`` (texts by cosine to a query vector) and
``text_analogy`` (the corpus texts nearest to b - a + c).

Static (``word_vector``, ``most_similar``, ``analogy``): rows of the input embedding matrix E (V, D),
compared by cosine. A word the tokenizer cuts into several pieces (WordPiece ``un ##bel ##ie ##va ##bly``)
gets the average of its pieces' rows; the candidates returned are single vocabulary entries (special
tokens, ``[unused]`` slots and, by default, ``##`` continuation pieces left out)::

    >>> analogy(model, tok, "man", "king", "woman", k=5)        # king - man + woman  # doctest: +SKIP
    [('queen', 0.62), ...]
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.nn.pooling import mean_pool
from lmforge.nn.quant import QuantizedEmbedding
from lmforge.workflows.inspect import backbone, device_of

POOLINGS = ("mean", "cls", "last")


# -- contextual embeddings --------------------------------------------------------------------------------
def _batches(tokenizer: Any, texts: Sequence[str], batch_size: int, max_len: int, pad_id: int
             ) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(ids (B, T), attention mask (B, T), special-token mask (B, T)), right-padded to the batch's longest."""
    for first in range(0, len(texts), batch_size):
        encs = [tokenizer.encode(t) for t in texts[first:first + batch_size]]
        if any(len(e) > max_len for e in encs):
            print(f"lmforge: texts longer than {max_len} tokens are cut to {max_len}", file=sys.stderr)
        rows = [(e.ids[:max_len], e.special_tokens_mask[:max_len]) for e in encs]
        t = max(1, *(len(ids) for ids, _ in rows))
        ids = torch.full((len(rows), t), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), t), dtype=torch.long)
        special = torch.zeros((len(rows), t), dtype=torch.long)
        for i, (row, spec) in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            mask[i, : len(row)] = 1
            special[i, : len(spec)] = torch.tensor(spec, dtype=torch.long)
        yield ids, mask, special


def hidden_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(embeddings, layer 1, ..., layer L), each (B, T, D): an encoder-decoder gives its encoder's."""
    from lmforge.models import Seq2Seq

    core = backbone(model).eval()
    dev = device_of(core)
    ids, mask = ids.to(dev), mask.to(dev)
    with torch.inference_mode():
        if isinstance(core, Seq2Seq):
            return core.encode(ids, mask, output_hidden_states=True).hidden_states
        return core(ids, attention_mask=mask, output_hidden_states=True).hidden_states


def mix_layers(states: Sequence[torch.Tensor], weights: Sequence[float] | None = None,
               gamma: float = 1.0) -> torch.Tensor:
    """ELMo's scalar mix gamma * sum_j w_j h_j of L + 1 tensors (B, T, D); w uniform unless given.

    Given weights must be non-negative; they are divided by their sum (so [0, 0, 1] picks layer 2 exactly).
    The softmax scalars of ``lmforge.nn.ScalarMix`` are set to log w, so softmax gives back w.
    """
    from lmforge.nn.mix import ScalarMix

    n = len(states)
    mix = ScalarMix(n).to(states[0].device)
    if weights is not None:
        w = torch.tensor([float(v) for v in weights], dtype=torch.float64)
        if w.numel() != n:
            raise LmforgeError(f"--mix-weights: the model has {n} layers of hidden states "
                               f"(embeddings + {n - 1}), got {w.numel()} weights")
        if bool((w < 0).any()) or not float(w.sum()) > 0:
            raise LmforgeError("--mix-weights: weights must be non-negative with a positive sum")
        with torch.no_grad():
            mix.scalars.copy_(torch.log(w / w.sum()).float())  # -inf for a zero weight: softmax gives 0
    with torch.no_grad():
        mix.gamma.fill_(gamma)
        return mix(states)  # (B, T, D)


def pool(h: torch.Tensor, mask: torch.Tensor, special: torch.Tensor | None = None, how: str = "mean"
         ) -> torch.Tensor:
    """(B, T, D) -> (B, D). ``mask`` (B, T) 1 = real token; ``special`` (B, T) 1 = token left out of the mean."""
    if how == "cls":
        return h[:, 0]
    if how == "last":
        last = mask.sum(dim=1).clamp(min=1) - 1  # (B,) index of the last real token
        return h[torch.arange(h.shape[0], device=h.device), last]
    if how != "mean":
        raise LmforgeError(f"--pooling: {how!r} is not one of {', '.join(POOLINGS)}")
    keep = mask.bool() if special is None else mask.bool() & ~special.bool()  # (B, T)
    return mean_pool(h, keep)


def embed(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, layer: int | None = None,
          mix: bool = False, mix_weights: Sequence[float] | None = None, gamma: float = 1.0,
          pooling: str = "mean", exclude_special: bool = False, batch_size: int = 32) -> np.ndarray:
    """One vector per text, (N, D) float32.

    layer: index into hidden_states (0 = embeddings, -1 or None = last layer); mix: ELMo scalar mix of all
    layers instead (uniform, or ``mix_weights``, times ``gamma``); pooling: mean | cls | last;
    exclude_special: leave [CLS], [SEP] and the like out of the mean (sentence-transformers keeps them).
    """
    if mix and layer is not None:
        raise LmforgeError("--layer and --mix exclude each other: choose one")
    if pooling not in POOLINGS:
        raise LmforgeError(f"--pooling: {pooling!r} is not one of {', '.join(POOLINGS)}")
    if batch_size < 1:
        raise LmforgeError(f"--batch-size must be at least 1, got {batch_size}")
    config = backbone(model).config
    n_states = getattr(config, "n_layers", getattr(config, "n_encoder_layers", 0)) + 1
    if layer is not None and not -n_states <= layer < n_states:
        raise LmforgeError(f"--layer: {layer} is out of range; the model has hidden states 0..{n_states - 1} "
                           "(0 = embeddings)")
    pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    out = []
    for ids, mask, special in _batches(tokenizer, list(texts), batch_size, config.max_positions, pad_id):
        states = hidden_states(model, ids, mask)
        h = mix_layers(states, mix_weights, gamma) if mix else states[-1 if layer is None else layer]
        h = h.float()
        m = mask.to(h.device)
        out.append(pool(h, m, special.to(h.device) if exclude_special else None, pooling).cpu())
    if not out:
        return np.zeros((0, config.d_model), dtype=np.float32)
    return torch.cat(out).numpy().astype(np.float32)


# -- static word vectors ----------------------------------------------------------------------------------
def input_embeddings(model: nn.Module) -> torch.Tensor:
    """The token embedding matrix E (V, D) of any model (BERT word embeddings, GPT wte, Vaswani's shared E)."""
    core = backbone(model)
    for path in ("embeddings.tok_emb", "tok_emb", "embed"):
        module: Any = core
        for part in path.split("."):
            module = getattr(module, part, None)
        if isinstance(module, nn.Embedding):
            return module.weight.detach().float().cpu()
        if isinstance(module, QuantizedEmbedding):  # a quantized model's rows, read from its int8 head
            return module(torch.arange(module.num_embeddings)).cpu()
    raise LmforgeError(f"--model: found no input embeddings in a {type(core).__name__}")


def word_vector(model: nn.Module, tokenizer: Any, word: str, matrix: torch.Tensor | None = None) -> torch.Tensor:
    """E row of ``word``; the mean of its pieces' rows when the tokenizer splits it. (D,)"""
    ids = tokenizer.encode(word, add_special_tokens=False).ids
    if not ids:
        raise LmforgeError(f"{word!r}: no tokens")
    e = input_embeddings(model) if matrix is None else matrix
    return e[ids].mean(dim=0)


_BRACKETED = re.compile(r"^\[[^\]]*\]$|^<[^>]*>$")  # [unused12], [PAD], <unk>, <|endoftext|>


def candidate_ids(tokenizer: Any, subwords: bool = False) -> torch.Tensor:
    """Vocabulary ids worth returning as neighbours: not special, not [unused], not ## pieces unless asked."""
    keep = []
    for i, token in enumerate(tokenizer.id_to_token):
        if i in tokenizer.special_ids or _BRACKETED.match(token) or (not subwords and token.startswith("##")):
            continue
        keep.append(i)
    return torch.tensor(keep, dtype=torch.long)


def nearest(vector: torch.Tensor, matrix: torch.Tensor, candidates: torch.Tensor, k: int,
            exclude: set[int] = frozenset()) -> list[tuple[int, float]]:
    """The k candidate rows of ``matrix`` with the highest cosine to ``vector``: [(id, cosine), ...]."""
    rows = matrix[candidates]  # (C, D)
    cos = torch.nn.functional.cosine_similarity(rows, vector.unsqueeze(0), dim=-1)  # (C,)
    order = torch.argsort(cos, descending=True)
    out = []
    for j in order.tolist():
        token_id = int(candidates[j])
        if token_id in exclude:
            continue
        out.append((token_id, float(cos[j])))
        if len(out) == k:
            break
    return out


def _query_ids(tokenizer: Any, words: Sequence[str]) -> set[int]:
    return {i for w in words for i in tokenizer.encode(w, add_special_tokens=False).ids}


def most_similar(model: nn.Module, tokenizer: Any, word: str, k: int = 10, subwords: bool = False
                 ) -> list[tuple[str, float]]:
    """The k vocabulary tokens whose input embeddings are closest (cosine) to ``word``'s, the word left out."""
    e = input_embeddings(model)
    found = nearest(word_vector(model, tokenizer, word, e), e, candidate_ids(tokenizer, subwords), k,
                    _query_ids(tokenizer, [word]))
    return [(tokenizer.id_to_token[i], c) for i, c in found]


def analogy(model: nn.Module, tokenizer: Any, a: str, b: str, c: str, k: int = 5, subwords: bool = False
            ) -> list[tuple[str, float]]:
    """a is to b as c is to ?: the k tokens nearest to b - a + c (cosine), the three inputs left out.

    ``analogy(m, t, "man", "king", "woman")`` asks for king - man + woman.
    """
    e = input_embeddings(model)
    target = word_vector(model, tokenizer, b, e) - word_vector(model, tokenizer, a, e) + word_vector(
        model, tokenizer, c, e)
    found = nearest(target, e, candidate_ids(tokenizer, subwords), k, _query_ids(tokenizer, [a, b, c]))
    return [(tokenizer.id_to_token[i], cos) for i, cos in found]


def cosine(u: np.ndarray | torch.Tensor, v: np.ndarray | torch.Tensor) -> float:
    """cos(u, v) of two vectors."""
    u, v = torch.as_tensor(np.asarray(u, dtype=np.float64)), torch.as_tensor(np.asarray(v, dtype=np.float64))
    return float(u @ v / (u.norm() * v.norm()).clamp(min=1e-12))


def rank_texts(query: np.ndarray, vectors: np.ndarray, k: int | None = None) -> list[tuple[int, float]]:
    """Rows of ``vectors`` (N, D) by cosine to ``query`` (D,), best first: [(row, cosine), ...]."""
    v = np.asarray(vectors, dtype=np.float64)
    q = np.asarray(query, dtype=np.float64)
    cos = v @ q / np.maximum(np.linalg.norm(v, axis=1) * np.linalg.norm(q), 1e-12)  # (N,)
    order = np.argsort(-cos, kind="stable")[: k if k is not None else len(cos)]
    return [(int(i), float(cos[i])) for i in order]


def text_analogy(model: nn.Module, tokenizer: Any, a: str, b: str, c: str, corpus: Sequence[str], k: int = 5,
                 **options: Any) -> list[tuple[str, float]]:
    """a is to b as c is to ?, over contextual sentence embeddings: the corpus texts nearest to b - a + c.

    ``options`` go to ``embed`` (layer, mix, pooling, ...). Texts equal to a, b or c are left out.
    """
    vectors = embed(model, tokenizer, [a, b, c, *corpus], **options)  # (3 + N, D)
    target = vectors[1] - vectors[0] + vectors[2]
    ranked = [(corpus[i], cos) for i, cos in rank_texts(target, vectors[3:]) if corpus[i] not in (a, b, c)]
    return ranked[:k]
