"""Translation with an encoder-decoder (Transformer ``Seq2Seq`` or ``RNNSeq2Seq``): decode, score, align.

    >>> model, tokenizer = lmforge.load("runs/seq2seq-mini/model")                     # doctest: +SKIP
    >>> translate(model, tokenizer, ["God said, “Let there be light.”"], beams=4)      # doctest: +SKIP
    ['Y dijo Dios: Sea la luz.']
    >>> evaluate_translation(model, tokenizer, "test.tsv")["bleu"]                     # doctest: +SKIP

Sources are encoded exactly as the training pairs were (``lmforge.data.corpus.encode_lines`` without the
line break, no template tokens), sorted by length into batches (less padding), decoded with lmforge's
beam search or greedy search, and put back in their order. Scores are sacrebleu's corpus BLEU (13a
tokenization) and chrF, computed on detokenized text against one reference per source.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.text import source_ids
from lmforge.models.interfaces import special_ids


@torch.inference_mode()
def translate(
    model: nn.Module,
    tokenizer,
    sources: Sequence[str],
    beams: int = 4,
    length_penalty: float = 1.0,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    progress: bool = False,
) -> list[str]:
    """Translations of ``sources``, in order.

    max_new_tokens: the most target tokens per sentence; by default 1.5 x the longest source of the batch
    plus 10, capped by the model's max_positions. Sources longer than max_positions are cut (a warning).
    """
    from lmforge.generation import generate, pad_prompts

    model.eval()
    device = next(model.parameters()).device
    max_positions = int(getattr(model.config, "max_positions", 1024))
    pad_id = special_ids(model, tokenizer).pad
    encoded = []
    for i, text in enumerate(sources):
        ids = source_ids(tokenizer, text)
        if not ids:
            raise LmforgeError(f"source {i + 1}: empty sentence")
        if len(ids) > max_positions:
            print(f"lmforge translate: source {i + 1} has {len(ids)} tokens; cut to {max_positions}", file=sys.stderr)
            ids = ids[:max_positions]
        encoded.append(ids)
    order = np.argsort([len(ids) for ids in encoded], kind="stable")
    results: list[str] = [""] * len(sources)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(sources), desc="translating", unit=" sentences", file=sys.stderr)
    for first in range(0, len(order), batch_size):
        rows = [int(i) for i in order[first:first + batch_size]]
        ids, mask = pad_prompts([encoded[i] for i in rows], pad_id, device)
        longest = ids.shape[1]
        budget = max_new_tokens or int(1.5 * longest) + 10
        budget = min(budget, max_positions - 1)
        out = generate(model, ids, mask, max_new_tokens=budget, beams=beams, length_penalty=length_penalty,
                       pad_id=pad_id)
        for row, new in zip(rows, out.to_lists(), strict=True):
            results[row] = tokenizer.decode(new, skip_special_tokens=True).strip()
        if bar is not None:
            bar.update(len(rows))
    if bar is not None:
        bar.close()
    return results


def require_sacrebleu() -> None:
    """One line, before any translating, when the scorer is missing (the ``translate`` extra)."""
    try:
        import sacrebleu  # noqa: F401
    except ImportError:
        raise LmforgeError("--eval scores with sacrebleu, which is not installed: pip install 'lmforge[translate]' "
                           "(or pip install sacrebleu)") from None


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, Any]:
    """sacrebleu's corpus BLEU and chrF of ``hypotheses`` against one reference each.

    >>> corpus_scores(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"]   # doctest: +SKIP
    100.0
    """
    try:
        import sacrebleu
    except ImportError:
        raise LmforgeError("BLEU needs sacrebleu: pip install 'lmforge[translate]'") from None
    if len(hypotheses) != len(references):
        raise LmforgeError(f"{len(hypotheses)} translations for {len(references)} references")
    bleu = sacrebleu.corpus_bleu(list(hypotheses), [list(references)])
    chrf = sacrebleu.corpus_chrf(list(hypotheses), [list(references)])
    return {"bleu": round(bleu.score, 2), "chrf": round(chrf.score, 2), "bleu_detail": str(bleu),
            "sacrebleu": sacrebleu.__version__}


def read_pairs(path: str | Path, limit: int | None = None) -> list[tuple[str, str]]:
    from lmforge.workflows.pretrain import read_pairs as read_tsv

    pairs = read_tsv(Path(path))
    return pairs[:limit] if limit else pairs


def evaluate_translation(model: nn.Module, tokenizer, pairs_file: str | Path, beams: int = 4,
                         length_penalty: float = 1.0, limit: int | None = None, batch_size: int = 32,
                         progress: bool = True) -> dict[str, Any]:
    """Translate the sources of a source<TAB>target file and score them: BLEU, chrF, time, samples."""
    pairs = read_pairs(pairs_file, limit)
    start = time.perf_counter()
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs], beams=beams, length_penalty=length_penalty,
                           batch_size=batch_size, progress=progress)
    seconds = time.perf_counter() - start
    scores = corpus_scores(hypotheses, [t for _, t in pairs])
    return {**scores, "sentences": len(pairs), "beams": beams, "seconds": round(seconds, 2),
            "hypotheses": hypotheses, "pairs": pairs}


@dataclass
class Alignment:
    """Cross-attention of a translation: ``weights`` (T_target, S_source), rows sum to 1 over real sources."""

    source_tokens: list[str]
    target_tokens: list[str]
    weights: np.ndarray


@torch.inference_mode()
def alignment(model: nn.Module, tokenizer, source: str, target: str, layer: int = -1) -> Alignment:
    """Which source tokens each target token attends to, teacher-forcing ``target`` after ``source``.

    Transformer: decoder layer ``layer``'s cross-attention averaged over its heads. RNN with attention:
    its single attention (``layer`` is ignored).
    """
    model.eval()
    device = next(model.parameters()).device
    src = source_ids(tokenizer, source)
    tgt = source_ids(tokenizer, target)
    start = special_ids(model, tokenizer).decoder_start
    src_ids = torch.tensor([src], device=device)
    tgt_ids = torch.tensor([[start, *tgt]], device=device)
    out = model(src_ids, tgt_ids, output_attentions=True)
    cross = out.cross_attentions
    if not cross:
        raise LmforgeError(f"{type(model).__name__} returns no cross-attention weights")
    weights = cross[layer if len(cross) > 1 else 0][0].float().mean(0)  # (T_target + 1, S): heads averaged
    pieces = [tokenizer.decode([i]) for i in src]
    targets = [tokenizer.decode([i]) for i in tgt] + ["</s>"]
    return Alignment(pieces, targets, weights.cpu().numpy())


def plot_alignment(alignments: Sequence[tuple[str, Alignment]], path: str | Path) -> Path:
    """Heatmaps of one or more alignments side by side (rows: target tokens, columns: source tokens)."""
    from lmforge.viz.plots import pyplot, save_figure

    plt = pyplot()
    n = len(alignments)
    first = alignments[0][1]
    width = max(4.0, 0.28 * len(first.source_tokens) + 1.5)
    height = max(3.0, 0.28 * len(first.target_tokens) + 1.2)
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    for ax, (title, a) in zip(axes[0], alignments, strict=True):
        ax.imshow(a.weights, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(a.source_tokens)), [t.strip() or "␣" for t in a.source_tokens], rotation=90,
                      fontsize=8)
        ax.set_yticks(range(len(a.target_tokens)), [t.strip() or "␣" for t in a.target_tokens], fontsize=8)
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=110)
