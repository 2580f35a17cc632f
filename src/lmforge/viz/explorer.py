"""The self-contained HTML attention explorer: one file, weights inside, no network, no external script.

    >>> maps = attention_maps(model, tokenizer, "Juventus lost from Ajax")             # doctest: +SKIP
    >>> write_attention_page(maps, "juventus.html", model_name="all-MiniLM-L6-v2")                      # doctest: +SKIP

Open the file in any browser. The weights are stored as JSON inside the page (``page_data`` reads
them back), rounded to 4 decimals, the precision the page shows on hover: a 6-layer, 12-head model on an
11-token sentence makes a page of about 100 kB; the size grows with layers x heads x tokens², so a 128-token
text is several MB. The page itself (model view, head view, matrix; layout, colours, behaviour) is in
``explorer_page.py``.
"""

from __future__ import annotations

import functools
import html
import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic
from lmforge.viz.explorer_page import PAGE, SCRIPT, STYLE
from lmforge.viz.views import AttentionMaps

DATA_RE = re.compile(r'<script type="application/json" id="attention-data">(.*?)</script>', re.S)
LARGE_PAGE = 20_000_000  # bytes: beyond this the page is still written, with a warning


DECIMALS = 4  # the weights in the page, and on hover


def _number(x: float) -> str:
    """0.12345 -> '0.1235', 0.0 -> '0', 1.0 -> '1', 0.25 -> '0.25': four decimals, no trailing zeros."""
    s = f"{x:.{DECIMALS}f}".rstrip("0").rstrip(".")
    return "0" if s in ("", "-0") else s


@functools.cache
def _written() -> np.ndarray:
    """Every value of [0, 1] at DECIMALS decimals as the page writes it, indexed by value x 10^DECIMALS."""
    scale = 10**DECIMALS
    return np.array([_number(k / scale) for k in range(scale + 1)], dtype=object)


def compact_weights(w: np.ndarray) -> str:
    """A nested JSON array of ``w`` (any rank) with every number at ``DECIMALS`` decimals. Weights in [0, 1] (what
    attention gives) are looked up in a table of their 10,001 written forms: a page of millions of weights is
    written in a fraction of a second, without a Python call per number; other values are formatted one by one."""
    w = np.asarray(w, dtype=np.float64)
    scaled = np.rint(w * 10**DECIMALS)
    if w.size and (np.isfinite(scaled).all() and scaled.min() >= 0 and scaled.max() <= 10**DECIMALS):
        return _nested(_written()[scaled.astype(np.int64)])
    return _nested(np.vectorize(_number, otypes=[object])(w) if w.size else w.astype(object))


def _nested(texts: np.ndarray) -> str:
    if texts.ndim == 1:
        return "[" + ",".join(texts.tolist()) + "]"
    return "[" + ",".join(_nested(part) for part in texts) + "]"


def _script_safe(text: str) -> str:
    """JSON that cannot end its <script> element early: <, > and & as \\u escapes (still valid JSON)."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page_json(maps: AttentionMaps, model_name: str = "", start: dict[str, int] | None = None) -> str:
    """The JSON the page embeds (see ``explorer_page`` for its shape); ``start`` = the view, layer, head shown first."""
    head = {"title": "lmforge attention explorer", "model": model_name or maps.architecture, "text": maps.text,
            "target": maps.target, "start": start or {}}
    views = []
    for v in maps.views.values():
        meta = {"name": v.name, "label": v.label, "causal": v.causal, "queries": v.queries, "keys": v.keys}
        body = json.dumps(meta, ensure_ascii=False)[:-1]  # without the closing brace
        views.append(f'{body}, "weights": {compact_weights(np.asarray(v.weights, dtype=np.float64))}}}')
    return json.dumps(head, ensure_ascii=False)[:-1] + ', "views": [' + ", ".join(views) + "]}"


def start_at(maps: AttentionMaps, view: str | None = None, layer: int | None = None, head: int | None = None
             ) -> dict[str, int]:
    """{"view", "layer", "head"} indices the page opens on, checked against ``maps`` (errors name the option)."""
    from lmforge.viz.attention import check_index

    names = list(maps.views)
    chosen = maps.view(view)
    n_layers, n_heads = chosen.weights.shape[:2]
    start = {"view": names.index(chosen.name)}
    if layer is not None:
        start["layer"] = check_index(layer, n_layers, "layer")
    if head is not None:
        start["head"] = check_index(head, n_heads, "head")
    return start


def attention_page(maps: AttentionMaps, model_name: str = "", view: str | None = None, layer: int | None = None,
                   head: int | None = None) -> str:
    """The whole page as a string; ``view``/``layer``/``head`` choose what it shows first."""
    if not maps.views:
        raise LmforgeError("no attention to show")
    title = f"Attention: {model_name or maps.architecture}"
    data = page_json(maps, model_name, start_at(maps, view, layer, head))
    return PAGE.format(title=html.escape(title), style=STYLE, script=SCRIPT, data=_script_safe(data))


def write_attention_page(maps: AttentionMaps, path: str | Path, model_name: str = "", view: str | None = None,
                         layer: int | None = None, head: int | None = None) -> Path:
    """Write the explorer for ``maps`` to ``path``, opening on ``view``/``layer``/``head``; returns the path."""
    text = attention_page(maps, model_name, view, layer, head)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    if len(text) > LARGE_PAGE:
        print(f"lmforge: {path} is {len(text) / 1e6:.0f} MB; shorter text keeps it light", file=sys.stderr)
    return path


def page_data(page: str) -> dict[str, Any]:
    """The JSON embedded in an explorer page, parsed back (weights as nested lists)."""
    found = DATA_RE.search(page)
    if found is None:
        raise LmforgeError("not an lmforge attention page (no attention-data script)")
    return json.loads(found.group(1))
