"""The attention explorer's page: the HTML skeleton here, its CSS and plain JavaScript in ``explorer.css`` and
``explorer.js`` beside this file, inlined into each page (one self-contained file, no external resource).

``lmforge.viz.explorer.attention_page`` fills ``PAGE`` with a title and the JSON of the weights. The
script reads that JSON from ``<script type="application/json" id="attention-data">``, whose shape is::

    {"title": "...", "model": "...", "text": "...", "target": null, "start": {"view": 0, "layer": 3, "head": 1},
     "views": [{"name": "encoder", "label": "encoder self-attention", "causal": false,
                "queries": ["[CLS]", ...], "keys": ["[CLS]", ...],
                "weights": [[[[0.5123, 0.03, ...], ...]]]}]}        # [layer][head][query][key], 4 decimals

The page has three tabs over the same numbers (the view selector picks encoder, decoder or cross):

- **Model view**: every layer x head as a small heatmap (one pixel of its canvas per weight, scaled up),
  layers down, heads across. Hovering a cell shows "layer l · head h / query → key: 0.4312"; clicking a
  panel (or Enter on it) opens that head in the Matrix tab.
- **Head view**: one layer; the query tokens on the left, the key tokens on the right, a line from query i
  to key j for each head whose weight is at least ``LINE_THRESHOLD``, in the head's colour, with opacity =
  the weight and width 1 + 3 x weight. Head buttons switch heads on and off (double-click: that head
  alone). Hovering a token keeps only its lines; clicking pins it; hovering a line, or a key while a query
  is pinned, shows the exact weights.
- **Matrix**: one head (or the mean of the heads), large: it takes the window's width and height. Hovering
  a query token paints every key token with the colour of its weight (the exact weight in its ``data-w``)
  and lists the three largest in the status line; clicking pins it. Hovering a heatmap cell selects its
  row and shows the weight; cells of 36 px or more print it.

Colours: weight w is drawn as ``RAMP`` at sqrt(w) (the PNGs' square-root scale; the "Colour scale"
selector switches to w itself), interpolated linearly between its stops, which are matplotlib's magma
(CC0) reversed: cream for 0 through orange and magenta to near-black for 1, lightness falling all the way,
so a darker cell is always a larger weight, in grey print and for colour-blind readers too. A scale bar
stands beside each heatmap. Cells a causal mask forbids are grey (``MASKED``). Text on a cell is black or
white, whichever contrasts more (WCAG relative luminance).

Keys: 1 2 3 switch tabs, ←/→ the head, ↑/↓ the layer, Esc unpins; Tab reaches the tabs, the panels and
the query tokens, Enter opens or pins them. The address ends in #model, #head or #matrix (a link can open
a tab); without one the page opens on the matrix when ``start`` names a head, on the head view when it
names only a layer, else on the model view.
"""

import json
from pathlib import Path

# Weight 0 -> RAMP[0], weight 1 -> RAMP[-1], equal steps of sqrt(weight) between stops.
RAMP = ("#fcfdbf", "#fecf92", "#fe9f6d", "#f7705c", "#de4968", "#b73779", "#8c2981", "#641a80", "#3b0f70",
        "#140e36", "#000004")
MASKED = "#d0d7de"
LINE_THRESHOLD = 0.01  # the head view draws no line for a smaller weight
# One colour per head in the head view, each at least 3:1 against white (WCAG for graphics); after the
# twelfth, hues by the golden angle.
HEAD_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#b5179e", "#9c6b00", "#00838f", "#7b3294", "#b2182b",
                "#4d9221", "#e7298a", "#525252", "#3f51b5")

HERE = Path(__file__).parent
STYLE = (HERE / "explorer.css").read_text(encoding="utf-8")

SCRIPT_TEMPLATE = (HERE / "explorer.js").read_text(encoding="utf-8")

SCRIPT = (SCRIPT_TEMPLATE.replace("__RAMP__", json.dumps(list(RAMP))).replace("__MASKED__", json.dumps(MASKED))
          .replace("__LINE_THRESHOLD__", repr(LINE_THRESHOLD))
          .replace("__HEAD_COLOURS__", json.dumps(list(HEAD_COLOURS))))

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}</title>
<style>{style}</style>
</head>
<body>
<h1>{title}</h1>
<p class="meta" id="meta"></p>
<div class="bar">
  <div class="tabs" role="tablist" aria-label="views of the attention">
    <button type="button" role="tab" id="tab-model" aria-controls="pane-model">Model view</button>
    <button type="button" role="tab" id="tab-head" aria-controls="pane-head">Head view</button>
    <button type="button" role="tab" id="tab-matrix" aria-controls="pane-matrix">Matrix</button>
  </div>
  <div class="controls">
    <label id="view-control">View <select id="view"></select></label>
    <label id="layer-control">Layer <select id="layer"></select></label>
    <label id="head-control">Head <select id="head"></select></label>
    <label id="scale-control">Colour scale <select id="scale"><option value="sqrt">square root</option>
      <option value="linear">linear</option></select></label>
  </div>
</div>
<main>
<section id="pane-model" role="tabpanel" aria-labelledby="tab-model" hidden>
  <p class="hint">Every layer (down) and head (across): row = query token, column = key token, darker = more
  attention. Hover a cell for its weight; click a head (or Tab to it and press Enter) to open it large.</p>
  <div id="model-legend"></div>
  <div id="model-grid"></div>
</section>
<section id="pane-head" role="tabpanel" aria-labelledby="tab-head" hidden>
  <p class="hint">Each line joins a query (left) to a key (right): opacity and width = attention weight, colour =
  head; weights below 0.01 are not drawn; each head's lines leave and reach a token at their own height.
  Hover a token to keep only its lines, click to pin it; hover a line, or a key while a query is pinned, for
  the exact weights. Click a head to hide or show it, double-click to show
  it alone.</p>
  <div id="head-toggles"></div>
  <svg id="lines" role="img" aria-label="attention lines"></svg>
</section>
<section id="pane-matrix" role="tabpanel" aria-labelledby="tab-matrix" hidden>
  <p class="hint">Hover a query token to paint the keys with its attention; click to pin it. Each row of the
  heatmap is one query; hover a cell for its weight.</p>
  <div class="row"><div class="row-label" id="queries-label">query</div><div class="tokens" id="queries"></div></div>
  <div class="row"><div class="row-label" id="keys-label">key</div><div class="tokens" id="keys"></div></div>
  <div id="status"></div>
  <div class="matrix-area"><canvas id="heatmap" width="10" height="10"></canvas><div id="matrix-legend"></div></div>
</section>
<p class="hint">Keys: <kbd>1</kbd> <kbd>2</kbd> <kbd>3</kbd> switch views, <kbd>\u2190</kbd>/<kbd>\u2192</kbd>
the head, <kbd>\u2191</kbd>/<kbd>\u2193</kbd> the layer, <kbd>Esc</kbd> unpins.</p>
</main>
<div id="mark" hidden></div>
<div id="tip" role="tooltip" hidden></div>
<script type="application/json" id="attention-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
