"""What the attention pictures draw: a model's attention on one text, by *view*.

An encoder has one view (its self-attention), a decoder one (causal self-attention), an encoder-decoder
three: encoder self, decoder self and cross (decoder queries over encoder keys). ``lmforge.workflows.inspect``
fills them from a model; ``viz.attention`` (PNG heatmaps) and ``viz.explorer`` (the HTML page) draw them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lmforge.errors import LmforgeError

VIEW_LABELS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention (causal)",
    "cross": "cross-attention (decoder queries, encoder keys)",
}


@dataclass
class AttentionView:
    """One kind of attention of one text: ``weights[l, h, i, j]`` = how much query i reads key j."""

    name: str  # "encoder" | "decoder" | "cross"
    queries: list[str]  # tokens along the rows, Tq of them
    keys: list[str]  # tokens along the columns, Tk of them
    weights: np.ndarray  # (L, H, Tq, Tk) float32, rows sum to 1 (0 where masked)
    causal: bool = False

    @property
    def label(self) -> str:
        return VIEW_LABELS.get(self.name, self.name)


@dataclass
class AttentionMaps:
    """All attention of a model on a text, by view (encoder, decoder, cross), in that order."""

    architecture: str  # "Encoder" | "Decoder" | "Seq2Seq"
    text: str
    views: dict[str, AttentionView] = field(default_factory=dict)
    target: str | None = None  # the decoder's text, for an encoder-decoder

    def view(self, name: str | None = None) -> AttentionView:
        """The view called ``name`` (default: the first); an unknown name is a one-line error."""
        if name is None:
            return next(iter(self.views.values()))
        if name not in self.views:
            raise LmforgeError(f"--view: {name!r} is not a view of this model; choose one of {', '.join(self.views)}")
        return self.views[name]
