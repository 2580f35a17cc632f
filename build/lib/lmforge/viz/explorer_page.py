"""The attention explorer's page: HTML skeleton, inline CSS and plain JavaScript, no external resource.

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

# Weight 0 -> RAMP[0], weight 1 -> RAMP[-1], equal steps of sqrt(weight) between stops.
RAMP = ("#fcfdbf", "#fecf92", "#fe9f6d", "#f7705c", "#de4968", "#b73779", "#8c2981", "#641a80", "#3b0f70",
        "#140e36", "#000004")
MASKED = "#d0d7de"
LINE_THRESHOLD = 0.01  # the head view draws no line for a smaller weight
# One colour per head in the head view, each at least 3:1 against white (WCAG for graphics); after the
# twelfth, hues by the golden angle.
HEAD_COLOURS = ("#0072b2", "#d55e00", "#009e73", "#b5179e", "#9c6b00", "#00838f", "#7b3294", "#b2182b",
                "#4d9221", "#e7298a", "#525252", "#3f51b5")

STYLE = """
:root { --ink: #1f2328; --muted: #57606a; --rule: #d0d7de; --accent: #0969da; --soft: #f6f8fa; }
html { scroll-padding-top: 5em; }  /* what is scrolled into view is not left under the sticky bar */
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: .9em 1.6em 2em; color: var(--ink);
       background: #ffffff; }
h1 { font-size: 1.3em; margin: 0; }
.meta { color: var(--muted); margin: .1em 0 .6em; overflow-wrap: anywhere; }
.bar { display: flex; gap: .6em 1.4em; flex-wrap: wrap; align-items: center; padding: .45em 0;
       border-bottom: 1px solid var(--rule); position: sticky; top: 0; background: #ffffff; z-index: 2; }
.tabs { display: inline-flex; border: 1px solid var(--ink); border-radius: 6px; overflow: hidden; }
.tabs button { font: inherit; font-weight: 600; border: 0; background: #ffffff; color: var(--ink);
               padding: .25em .9em; cursor: pointer; }
.tabs button + button { border-left: 1px solid var(--ink); }
.tabs button[aria-selected="true"] { background: var(--ink); color: #ffffff; }
.controls { display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; }
.controls label { font-weight: 600; }
.controls select { font: inherit; margin-left: .3em; }
button:focus-visible, .panel:focus-visible, .tok:focus-visible, svg text:focus-visible {
  outline: 3px solid var(--accent); outline-offset: 1px; }
.hint { color: var(--muted); font-size: .9em; margin: .5em 0 .7em; }
kbd { font: .85em ui-monospace, Menlo, Consolas, monospace; border: 1px solid var(--rule); border-bottom-width: 2px;
      border-radius: 3px; padding: 0 .3em; background: var(--soft); color: var(--ink); }
.mono, .tok, #status, #tip, .axis { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
.legend { display: inline-flex; gap: .6em; align-items: center; font-size: .85em; color: var(--ink); }
.legend canvas { border: 1px solid var(--ink); display: block; }
.legend .ticks { position: relative; }
.legend .ticks span { position: absolute; white-space: nowrap; }
.legend.vertical { flex-direction: column; align-items: flex-start; }
.legend.vertical .caption { white-space: pre; }
.legend.vertical .scale { display: flex; gap: 5px; }
.legend.vertical .ticks span { transform: translateY(-50%); left: 0; }
.legend.horizontal .ticks span { transform: translateX(-50%); top: 0; }
.legend .masked { display: inline-flex; gap: .35em; align-items: center; }
.legend .masked i { display: inline-block; width: 14px; height: 14px; border: 1px solid var(--ink); }
#model-grid { display: grid; gap: 4px; align-items: center; justify-content: start; margin-top: .6em; }
.axis { color: var(--muted); font-size: .8em; text-align: center; white-space: nowrap; }
.axis.layer { text-align: right; padding-right: 6px; }
.panel { border: 2px solid transparent; border-radius: 3px; cursor: zoom-in; line-height: 0; }
.panel canvas { display: block; image-rendering: pixelated; image-rendering: crisp-edges; }
.panel:hover { border-color: var(--ink); }
.panel.current { border-color: var(--accent); }
.row { display: flex; align-items: baseline; gap: .8em; margin: .45em 0; }
.row-label { width: 5.5em; flex: none; color: var(--muted); font-size: .85em; text-align: right; }
.tokens { display: flex; flex-wrap: wrap; gap: 4px; }
.tok { padding: 2px 5px; border: 1px solid var(--rule); border-radius: 4px; cursor: pointer; background: #ffffff;
       white-space: pre; }
.tok.query:hover { border-color: var(--ink); }
.tok.active { border-color: var(--accent); box-shadow: 0 0 0 2px var(--accent); }
.tok.pinned { border-color: var(--accent); box-shadow: 0 0 0 3px var(--accent); }
#status { min-height: 1.5em; margin: .5em 0; font-size: .9em; overflow-wrap: anywhere; }
.matrix-area { display: flex; gap: 18px; align-items: flex-start; }
#heatmap { cursor: crosshair; display: block; }
#head-toggles { display: flex; flex-wrap: wrap; gap: 5px; align-items: center; margin: .4em 0 .2em; }
#head-toggles button { font: 13px ui-monospace, Menlo, Consolas, monospace; border: 2px solid var(--c);
                       border-radius: 4px; padding: 1px 7px; cursor: pointer; background: var(--c); color: var(--on); }
#head-toggles button[aria-pressed="false"] { background: #ffffff; color: var(--ink); }
#head-toggles button.plain { --c: var(--ink); --on: #ffffff; background: #ffffff; color: var(--ink); }
#lines text { font: 14px ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; fill: var(--ink);
              cursor: pointer; }
#lines text.column { font-family: system-ui, sans-serif; font-size: 12px; fill: var(--muted); cursor: default; }
#lines text.active { font-weight: 700; fill: #000000; }
#lines text.pinned { text-decoration: underline; }
#lines line { stroke-linecap: round; }
#lines line.off { display: none; }
#mark { position: absolute; z-index: 9; pointer-events: none; border: 1px solid #ffffff; outline: 1px solid #000000;
        box-sizing: content-box; }
#tip { position: absolute; z-index: 10; pointer-events: none; background: var(--ink); color: #ffffff; font-size: 13px;
       line-height: 1.4; padding: 4px 8px; border-radius: 4px; white-space: pre; box-shadow: 0 2px 8px #0004; }
"""

SCRIPT_TEMPLATE = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attention-data").textContent);
  var $ = function (id) { return document.getElementById(id); };
  var RAMP = __RAMP__, MASKED = __MASKED__, LINE_THRESHOLD = __LINE_THRESHOLD__, HEAD_COLOURS = __HEAD_COLOURS__;
  var TABS = ["model", "head", "matrix"], TICKS = [0, 0.05, 0.1, 0.25, 0.5, 0.75, 1];
  var CELL_MAX = 96, ROW_MIN = 28, NUMBERS_FROM = 36, SVG = $("lines").namespaceURI;  // no URL in the page
  var start = data.start || {};
  var state = { view: start.view || 0, layer: start.layer || 0, head: String(start.head === undefined ? 0 : start.head),
                query: null, pinned: false, shown: null, focus: null, focusPinned: false, tab: null, scale: "sqrt" };

  // -- colours ------------------------------------------------------------------------------------------
  function rgbOf(hex) { return [1, 3, 5].map(function (k) { return parseInt(hex.substr(k, 2), 16); }); }
  var STOPS = RAMP.map(rgbOf), MASKED_RGB = rgbOf(MASKED);
  function ramp(t) {  // t in [0, 1] -> [r, g, b], linear between the stops
    t = Math.max(0, Math.min(1, t)) * (STOPS.length - 1);
    var k = Math.min(Math.floor(t), STOPS.length - 2), f = t - k, a = STOPS[k], b = STOPS[k + 1];
    return [0, 1, 2].map(function (c) { return Math.round(a[c] + (b[c] - a[c]) * f); });
  }
  function scaled(w) { w = Math.max(0, Math.min(1, w)); return state.scale === "linear" ? w : Math.sqrt(w); }
  function colour(w) { return ramp(scaled(w)); }  // the square-root scale by default
  function css(rgb) { return "rgb(" + rgb.join(",") + ")"; }
  function luminance(rgb) {  // WCAG relative luminance
    var lin = rgb.map(function (c) { c /= 255; return c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4); });
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2];
  }
  function ink(rgb) {  // black or white, whichever contrasts more with rgb
    var l = luminance(rgb);
    return (l + 0.05) / 0.05 >= 1.05 / (l + 0.05) ? "#000000" : "#ffffff";
  }
  function headColour(h) {
    return h < HEAD_COLOURS.length ? HEAD_COLOURS[h] : "hsl(" + Math.round(h * 137.5) % 360 + ",70%,38%)";
  }

  // -- data -----------------------------------------------------------------------------------------------
  function view() { return data.views[state.view]; }
  function nHeads() { return view().weights[0].length; }
  function masked(v, i, j) { return v.causal && j > i; }
  function fmt(w) { return w.toFixed(4); }
  function pair(v, i, j) { return v.queries[i] + " \u2192 " + v.keys[j]; }
  function headName(h) { return h === "mean" ? "mean of heads" : "head " + h; }

  // The (Tq, Tk) matrix of a layer and head; "mean" averages the heads.
  function matrix(layer, head) {
    var heads = view().weights[layer];
    if (head !== "mean") { return heads[Number(head)]; }
    return heads[0].map(function (row, i) {
      return row.map(function (_, j) {
        var s = 0; for (var h = 0; h < heads.length; h++) { s += heads[h][i][j]; } return s / heads.length;
      });
    });
  }

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) { e.className = cls; }
    if (text !== undefined) { e.textContent = text; }
    return e;
  }
  function option(select, value, text) {
    var o = el("option", "", text); o.value = String(value); select.appendChild(o);
  }
  var measurer = document.createElement("canvas").getContext("2d");
  function textWidth(tokens, font) {
    measurer.font = font;
    var widths = tokens.map(function (t) { return measurer.measureText(t).width; });
    return Math.ceil(Math.max.apply(null, widths.concat([0])));
  }
  function paneWidth() { return Math.max(320, document.querySelector("main").clientWidth); }

  // -- the tooltip ----------------------------------------------------------------------------------------
  var tip = $("tip");
  function showTip(e, lines) {
    tip.textContent = lines.join("\n"); tip.hidden = false;
    var x = e.pageX + 14, y = e.pageY + 16, right = window.scrollX + document.documentElement.clientWidth;
    if (x + tip.offsetWidth > right - 4) { x = Math.max(window.scrollX + 4, e.pageX - tip.offsetWidth - 10); }
    tip.style.left = x + "px"; tip.style.top = y + "px";
  }
  function hideTip() { tip.hidden = true; $("mark").hidden = true; }
  // Outline the cell under the mouse: x, y, w, h in the canvas's CSS pixels.
  function mark(canvas, x, y, w, h) {
    var r = canvas.getBoundingClientRect(), m = $("mark");
    m.style.left = (r.left + window.scrollX + x - 1) + "px"; m.style.top = (r.top + window.scrollY + y - 1) + "px";
    m.style.width = w + "px"; m.style.height = h + "px"; m.hidden = false;
  }

  // -- the colour scale -------------------------------------------------------------------------------------
  function legend(box, length, vertical, causal) {
    box.textContent = ""; box.className = "legend " + (vertical ? "vertical" : "horizontal");
    var thick = 14, bar = document.createElement("canvas"), ctx = bar.getContext("2d");
    bar.width = vertical ? thick : length; bar.height = vertical ? length : thick;
    for (var p = 0; p < length; p++) {
      var t = p / (length - 1);
      ctx.fillStyle = css(ramp(vertical ? 1 - t : t));
      if (vertical) { ctx.fillRect(0, p, thick, 1); } else { ctx.fillRect(p, 0, 1, thick); }
    }
    var ticks = el("div", "ticks");
    ticks.style[vertical ? "height" : "width"] = length + "px";
    ticks.style[vertical ? "width" : "height"] = vertical ? "3em" : "1.3em";
    TICKS.forEach(function (w) {
      var s = el("span", "", String(w)), at = scaled(w) * (length - 1);
      s.style[vertical ? "top" : "left"] = (vertical ? length - 1 - at : at) + "px";
      ticks.appendChild(s);
    });
    var caption = el("span", "caption", "attention weight" + (vertical ? "\n" : " ") + "(" +
                     (state.scale === "linear" ? "linear" : "square-root") + " scale)");
    if (vertical) {
      var scale = el("div", "scale"); scale.appendChild(bar); scale.appendChild(ticks);
      box.appendChild(caption); box.appendChild(scale);
    } else {
      var col = el("div"); col.appendChild(bar); col.appendChild(ticks);
      box.appendChild(caption); box.appendChild(col);
    }
    if (causal) {
      var m = el("span", "masked"), sw = el("i"); sw.style.background = MASKED;
      m.appendChild(sw); m.appendChild(el("span", "", "masked (causal)")); box.appendChild(m);
    }
  }

  // -- model view: every layer x head ---------------------------------------------------------------------
  function paint(canvas, m, v) {  // one canvas pixel per weight, scaled up by CSS
    var ctx = canvas.getContext("2d"), img = ctx.createImageData(v.keys.length, v.queries.length);
    for (var i = 0; i < v.queries.length; i++) {
      for (var j = 0; j < v.keys.length; j++) {
        var rgb = masked(v, i, j) && m[i][j] === 0 ? MASKED_RGB : colour(m[i][j]), o = 4 * (i * v.keys.length + j);
        img.data[o] = rgb[0]; img.data[o + 1] = rgb[1]; img.data[o + 2] = rgb[2]; img.data[o + 3] = 255;
      }
    }
    ctx.putImageData(img, 0, 0);
  }

  function renderModel() {
    var v = view(), L = v.weights.length, H = nHeads(), grid = $("model-grid");
    legend($("model-legend"), 320, false, v.causal);
    var labelW = 64, size = Math.floor((paneWidth() - labelW - 4 * H) / H) - 4;
    size = Math.max(40, Math.min(200, size));
    var h = Math.max(16, Math.round(size * Math.min(2, v.queries.length / v.keys.length)));
    grid.textContent = "";
    grid.style.gridTemplateColumns = labelW + "px repeat(" + H + ", " + (size + 4) + "px)";
    grid.appendChild(el("div", "axis", ""));
    for (var hh = 0; hh < H; hh++) { grid.appendChild(el("div", "axis", "head " + hh)); }
    for (var l = 0; l < L; l++) {
      grid.appendChild(el("div", "axis layer", "layer " + l));
      for (var k = 0; k < H; k++) {
        var panel = el("div", "panel"), canvas = document.createElement("canvas");
        panel.tabIndex = 0; panel.setAttribute("role", "button");
        panel.dataset.layer = String(l); panel.dataset.head = String(k);
        panel.setAttribute("aria-label", "layer " + l + ", head " + k + ": open it large");
        panel.classList.toggle("current", l === state.layer && String(k) === state.head);
        canvas.width = v.keys.length; canvas.height = v.queries.length;
        canvas.style.width = size + "px"; canvas.style.height = h + "px";
        paint(canvas, v.weights[l][k], v);
        panel.appendChild(canvas); grid.appendChild(panel);
      }
    }
  }

  function panelOf(e) { return e.target.closest ? e.target.closest(".panel") : null; }
  function panelCell(panel, e) {  // {i, j} of the cell under the mouse in a thumbnail
    var v = view(), r = panel.querySelector("canvas").getBoundingClientRect();
    var i = Math.floor((e.clientY - r.top) / r.height * v.queries.length);
    var j = Math.floor((e.clientX - r.left) / r.width * v.keys.length);
    return i >= 0 && j >= 0 && i < v.queries.length && j < v.keys.length ? { i: i, j: j } : null;
  }
  function openLarge(panel) {
    state.layer = Number(panel.dataset.layer); state.head = panel.dataset.head;
    $("layer").value = String(state.layer); $("head").value = state.head;
    hideTip(); setTab("matrix"); window.scrollTo(0, 0);
  }

  // -- head view: lines from queries to keys, one colour per head ----------------------------------------
  function svg(tag, attrs) {
    var e = document.createElementNS(SVG, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, String(attrs[k])); });
    return e;
  }

  // The head buttons: built once per view, then only their aria-pressed changes (a double-click must
  // land on the button its first click hit).
  function renderToggles() {
    var H = nHeads(), box = $("head-toggles");
    if (!state.shown || state.shown.length !== H) {
      state.shown = []; for (var h = 0; h < H; h++) { state.shown.push(true); }
    }
    if (box.dataset.view === String(state.view)) {
      Array.prototype.forEach.call(box.querySelectorAll("button[data-head]"), function (b) {
        b.setAttribute("aria-pressed", String(state.shown[Number(b.dataset.head)]));
      });
      return;
    }
    box.dataset.view = String(state.view); box.textContent = "";
    box.appendChild(el("span", "", "heads:"));
    state.shown.forEach(function (on, h) {
      var b = el("button", "", String(h)), c = headColour(h);
      b.type = "button"; b.dataset.head = String(h); b.setAttribute("aria-pressed", String(on));
      b.title = "head " + h + ": click to show or hide, double-click to show it alone";
      b.style.setProperty("--c", c);
      measurer.fillStyle = c; b.style.setProperty("--on", ink(rgbOf(measurer.fillStyle)));  // hsl() -> #rrggbb
      box.appendChild(b);
    });
    [["all", "show all heads"], ["none", "hide all heads"]].forEach(function (p) {
      var b = el("button", "plain", p[0]); b.type = "button"; b.dataset.all = p[0]; b.title = p[1]; box.appendChild(b);
    });
  }

  function renderHeadView() {
    renderToggles();
    var v = view(), heads = v.weights[state.layer], box = $("lines");
    var font = '14px ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace', top = 26;
    var rows = Math.max(v.queries.length, v.keys.length), bar = document.querySelector(".bar").offsetHeight;
    var rowH = Math.max(20, Math.min(34, Math.floor((window.innerHeight - bar - 150) / rows)));
    var cross = v.name === "cross", names = cross ? ["decoder (query)", "encoder (key)"] : ["query", "key"];
    var small = "12px system-ui, sans-serif";
    var leftW = Math.max(textWidth(v.queries, font), textWidth([names[0]], small)) + 12;
    var rightW = Math.max(textWidth(v.keys, font), textWidth([names[1]], small)) + 12;
    var gap = Math.max(200, Math.min(720, paneWidth() - leftW - rightW - 40));
    var width = leftW + gap + rightW, height = top + Math.max(v.queries.length, v.keys.length) * rowH + 6;
    var x0 = leftW, x1 = leftW + gap;
    box.textContent = ""; box.setAttribute("width", width); box.setAttribute("height", height);
    box.setAttribute("viewBox", "0 0 " + width + " " + height);
    box.appendChild(svg("text", { x: x0 - 8, y: 14, "text-anchor": "end", "class": "column" })).textContent = names[0];
    box.appendChild(svg("text", { x: x1 + 8, y: 14, "class": "column" })).textContent = names[1];
    // Each head's lines leave and reach a token a little above or below its middle, so that heads joining
    // the same two tokens stay apart.
    var y = function (k) { return top + k * rowH + rowH / 2; }, found = [], H = heads.length;
    var spread = function (h) { return H < 2 ? 0 : (h / (H - 1) - 0.5) * rowH * 0.6; };
    state.shown.forEach(function (on, h) {
      if (!on) { return; }
      for (var i = 0; i < v.queries.length; i++) {
        for (var j = 0; j < v.keys.length; j++) {
          if (heads[h][i][j] >= LINE_THRESHOLD) { found.push([heads[h][i][j], h, i, j]); }
        }
      }
    });
    found.sort(function (a, b) { return a[0] - b[0]; });  // the strongest lines on top
    var g = box.appendChild(svg("g", { "class": "links" }));
    found.forEach(function (f) {
      var line = svg("line", { x1: x0, y1: y(f[2]) + spread(f[1]), x2: x1, y2: y(f[3]) + spread(f[1]),
                               stroke: headColour(f[1]), "stroke-opacity": f[0],
                               "stroke-width": (1 + 3 * f[0]).toFixed(2) });
      line.dataset.head = String(f[1]); line.dataset.query = String(f[2]); line.dataset.key = String(f[3]);
      line.dataset.w = fmt(f[0]);
      g.appendChild(line);
    });
    v.queries.forEach(function (t, i) {
      var s = box.appendChild(svg("text", { x: x0 - 8, y: y(i), "text-anchor": "end", "dominant-baseline": "central",
                                            "class": "q", tabindex: 0 }));
      s.textContent = t; s.dataset.index = String(i);
    });
    v.keys.forEach(function (t, j) {
      var s = box.appendChild(svg("text", { x: x1 + 8, y: y(j), "dominant-baseline": "central", "class": "k" }));
      s.textContent = t; s.dataset.index = String(j);
    });
    focusLines();
  }

  // Keep only the lines of the focused token (query or key), or all of them.
  function focusLines() {
    var f = state.focus;
    Array.prototype.forEach.call($("lines").querySelectorAll("line"), function (line) {
      var off = f !== null && line.dataset[f.side === "q" ? "query" : "key"] !== String(f.index);
      line.classList.toggle("off", off);
    });
    Array.prototype.forEach.call($("lines").querySelectorAll("text.q, text.k"), function (t) {
      var on = f !== null && t.classList.contains(f.side) && t.dataset.index === String(f.index);
      t.classList.toggle("active", on); t.classList.toggle("pinned", on && state.focusPinned);
    });
  }
  function setFocus(f) { state.focus = f; focusLines(); }

  function headViewEvents() {
    var box = $("lines");
    box.addEventListener("mouseover", function (e) {
      var t = e.target, v = view();
      if (t.tagName === "line") {
        var h = Number(t.dataset.head);
        showTip(e, ["layer " + state.layer + " \u00b7 head " + h,
                    pair(v, Number(t.dataset.query), Number(t.dataset.key)) + ": " + t.dataset.w]);
      } else if (t.classList && (t.classList.contains("q") || t.classList.contains("k"))) {
        var side = t.classList.contains("q") ? "q" : "k", index = Number(t.dataset.index);
        if (side === "k" && state.focusPinned && state.focus.side === "q") {
          var i = state.focus.index, heads = v.weights[state.layer];
          var lines = [pair(v, i, index) + ", layer " + state.layer];
          state.shown.forEach(function (on, h) {
            if (on) { lines.push("head " + h + ": " + fmt(heads[h][i][index])); }
          });
          showTip(e, lines);
        } else if (!state.focusPinned) { setFocus({ side: side, index: index }); }
      }
    });
    box.addEventListener("mouseout", function (e) {
      hideTip();
      var t = e.target;
      if (!state.focusPinned && t.classList && (t.classList.contains("q") || t.classList.contains("k"))) {
        setFocus(null);
      }
    });
    box.addEventListener("click", function (e) {
      var t = e.target;
      if (!(t.classList && (t.classList.contains("q") || t.classList.contains("k")))) { return; }
      pinFocus({ side: t.classList.contains("q") ? "q" : "k", index: Number(t.dataset.index) });
    });
    box.addEventListener("focusin", function (e) {
      if (!state.focusPinned && e.target.classList.contains("q")) {
        setFocus({ side: "q", index: Number(e.target.dataset.index) });
      }
    });
    box.addEventListener("keydown", function (e) {
      if ((e.key === "Enter" || e.key === " ") && e.target.classList.contains("q")) {
        pinFocus({ side: "q", index: Number(e.target.dataset.index) }); e.preventDefault();
      }
    });
    $("head-toggles").addEventListener("click", function (e) {
      var b = e.target.closest("button");
      if (!b) { return; }
      if (b.dataset.all) { state.shown = state.shown.map(function () { return b.dataset.all === "all"; }); }
      else { var h = Number(b.dataset.head); state.shown[h] = !state.shown[h]; }
      renderHeadView();
    });
    $("head-toggles").addEventListener("dblclick", function (e) {
      var b = e.target.closest("button");
      if (!b || b.dataset.all) { return; }
      var h = Number(b.dataset.head);
      state.shown = state.shown.map(function (_, k) { return k === h; });
      renderHeadView();
    });
  }
  function pinFocus(f) {
    var same = state.focus && state.focus.side === f.side && state.focus.index === f.index;
    if (state.focusPinned && same) { state.focusPinned = false; setFocus(null); return; }
    state.focusPinned = true; setFocus(f);
  }

  // -- matrix: one head, large -------------------------------------------------------------------------------
  function fillSelectors() {
    var v = view(), layer = $("layer"), head = $("head");
    layer.textContent = ""; head.textContent = "";
    for (var l = 0; l < v.weights.length; l++) { option(layer, l, String(l)); }
    for (var h = 0; h < v.weights[0].length; h++) { option(head, h, String(h)); }
    option(head, "mean", "mean of heads");
    state.layer = Math.min(state.layer, v.weights.length - 1);
    if (state.head !== "mean") { state.head = String(Math.min(Number(state.head), v.weights[0].length - 1)); }
    layer.value = String(state.layer); head.value = state.head;
  }

  function tokenRow(id, tokens, cls) {
    var box = $(id); box.textContent = "";
    tokens.forEach(function (t, i) {
      var s = el("span", "tok " + cls, t); s.dataset.index = String(i);
      if (cls === "query") { s.tabIndex = 0; }
      box.appendChild(s);
    });
    return box;
  }

  function renderTokens() {
    var v = view(), cross = v.name === "cross";
    $("queries-label").textContent = cross ? "decoder" : "query";
    $("keys-label").textContent = cross ? "encoder" : "key";
    var q = tokenRow("queries", v.queries, "query");
    tokenRow("keys", v.keys, "key");
    Array.prototype.forEach.call(q.children, function (s) {
      var i = Number(s.dataset.index);
      s.addEventListener("mouseenter", function () { if (!state.pinned) { select(i); } });
      s.addEventListener("mouseleave", function () { if (!state.pinned) { select(null); } });
      s.addEventListener("focus", function () { if (!state.pinned) { select(i); } });
      s.addEventListener("click", function () { pin(i); });
      s.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") { pin(i); e.preventDefault(); }
      });
    });
  }

  function pin(i) {
    if (state.pinned && state.query === i) { state.pinned = false; select(null); return; }
    state.pinned = true; select(i);
  }

  // Paint the keys of query i (or clear them when i is null), update the status line and the heatmap.
  function select(i) {
    state.query = i;
    var v = view(), m = matrix(state.layer, state.head);
    Array.prototype.forEach.call($("queries").children, function (s, k) {
      s.classList.toggle("active", k === i);
      s.classList.toggle("pinned", state.pinned && k === i);
    });
    Array.prototype.forEach.call($("keys").children, function (s, j) {
      if (i === null) { s.style.backgroundColor = ""; s.style.color = ""; s.dataset.w = ""; s.title = ""; return; }
      var w = m[i][j], rgb = masked(v, i, j) && w === 0 ? MASKED_RGB : colour(w);
      s.style.backgroundColor = css(rgb); s.style.color = ink(rgb);
      s.dataset.w = fmt(w); s.title = pair(v, i, j) + ": " + fmt(w);
    });
    var status = $("status");
    if (i === null) { status.textContent = "hover or click a query token, or a row of the heatmap"; }
    else {
      var order = m[i].map(function (w, j) { return [w, j]; }).sort(function (a, b) { return b[0] - a[0]; });
      status.textContent = "layer " + state.layer + ", head " + state.head + ": " + JSON.stringify(v.queries[i]) +
        " attends to " + order.slice(0, 3).map(function (p) {
          return JSON.stringify(v.keys[p[1]]) + " " + fmt(p[0]);
        }).join(", ");
    }
    draw();
  }

  // The heatmap, as large as the window allows: query tokens on the left, key tokens on top, the
  // current query's row outlined; the weight printed in cells of NUMBERS_FROM px or more.
  function draw() {
    if (state.tab !== "matrix") { return; }
    var v = view(), m = matrix(state.layer, state.head), canvas = $("heatmap"), ctx = canvas.getContext("2d");
    var big = '14px ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace';
    // Room: the pane's width less the colour scale; the window's height below the heatmap's place on the
    // page if that leaves rows of ROW_MIN px, else the window less the sticky bar (scroll down to it).
    var room = paneWidth() - 190;
    var below = window.innerHeight - (canvas.getBoundingClientRect().top + window.scrollY) - 12;
    var left = textWidth(v.queries, big) + 10, top = textWidth(v.keys, big) + 10;
    var tall = (below - top) / v.queries.length >= ROW_MIN ? below
      : Math.max(200, window.innerHeight - document.querySelector(".bar").offsetHeight - 24);
    var ch = Math.max(3, Math.min(CELL_MAX, Math.floor((tall - top) / v.queries.length)));
    var cw = Math.max(3, Math.min(CELL_MAX, Math.floor((room - left) / v.keys.length), Math.round(2.5 * ch)));
    var c = Math.min(cw, ch);
    var font = Math.max(9, Math.min(14, c - 3)) + 'px ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace';
    var labels = c >= 9;
    left = labels ? textWidth(v.queries, font) + 10 : 0; top = labels ? textWidth(v.keys, font) + 10 : 0;
    var W = left + v.keys.length * cw, H = top + v.queries.length * ch, dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(W * dpr); canvas.height = Math.round(H * dpr);
    canvas.style.width = W + "px"; canvas.style.height = H + "px";
    canvas.dataset.cellWidth = String(cw); canvas.dataset.cellHeight = String(ch);
    canvas.dataset.left = String(left); canvas.dataset.top = String(top);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, W, H);
    ctx.font = font; ctx.fillStyle = "#1f2328"; ctx.textBaseline = "middle";
    if (labels) {
      ctx.textAlign = "right";
      v.queries.forEach(function (t, i) {
        ctx.font = (i === state.query ? "bold " : "") + font; ctx.fillText(t, left - 5, top + i * ch + ch / 2);
      });
      ctx.font = font; ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
      v.keys.forEach(function (t, j) { ctx.fillText(t, -top + 5, left + j * cw + cw / 2); });
      ctx.restore();
    }
    var numbers = cw >= NUMBERS_FROM && ch >= 20;
    var small = Math.min(14, Math.floor(Math.min(cw / 3.2, ch / 2))) + "px system-ui, sans-serif";
    ctx.textAlign = "center";
    for (var i = 0; i < m.length; i++) {
      for (var j = 0; j < m[i].length; j++) {
        var w = m[i][j], rgb = masked(v, i, j) && w === 0 ? MASKED_RGB : colour(w);
        ctx.fillStyle = css(rgb); ctx.fillRect(left + j * cw, top + i * ch, cw, ch);
        if (numbers && !(masked(v, i, j) && w === 0)) {
          ctx.font = small; ctx.fillStyle = ink(rgb);
          ctx.fillText(w.toFixed(2), left + j * cw + cw / 2, top + i * ch + ch / 2);
        }
      }
    }
    if (state.query !== null) {  // white inside black: visible on every colour of the ramp
      var y = top + state.query * ch, x = left, wd = v.keys.length * cw;
      ctx.lineWidth = 3; ctx.strokeStyle = "#000000"; ctx.strokeRect(x + 1.5, y + 1.5, wd - 3, ch - 3);
      ctx.lineWidth = 1; ctx.strokeStyle = "#ffffff"; ctx.strokeRect(x + 3.5, y + 3.5, wd - 7, ch - 7);
    }
    legend($("matrix-legend"), Math.max(160, Math.min(420, v.queries.length * ch)), true, v.causal);
  }

  // The cell {i, j} under the mouse on the heatmap, or null.
  function cellAt(e) {
    var canvas = $("heatmap"), r = canvas.getBoundingClientRect();
    var x = e.clientX - r.left - Number(canvas.dataset.left), y = e.clientY - r.top - Number(canvas.dataset.top);
    var i = Math.floor(y / Number(canvas.dataset.cellHeight)), j = Math.floor(x / Number(canvas.dataset.cellWidth));
    var v = view();
    return x >= 0 && y >= 0 && i < v.queries.length && j < v.keys.length ? { i: i, j: j } : null;
  }

  function cellTip(e, layer, head, m, v, at) {
    var w = m[at.i][at.j];
    showTip(e, ["layer " + layer + " \u00b7 " + headName(head),
                pair(v, at.i, at.j) + ": " + (masked(v, at.i, at.j) && w === 0 ? "masked" : fmt(w))]);
  }

  // -- tabs, controls, keys -------------------------------------------------------------------------------
  function setTab(name) {
    state.tab = name;
    TABS.forEach(function (t) {
      $("tab-" + t).setAttribute("aria-selected", String(t === name));
      $("tab-" + t).tabIndex = t === name ? 0 : -1;
      $("pane-" + t).hidden = t !== name;
    });
    $("layer-control").hidden = name === "model";
    $("head-control").hidden = name !== "matrix";
    $("scale-control").hidden = name === "head";
    try { history.replaceState(null, "", "#" + name); } catch (err) { /* some browsers refuse it for file: pages */ }
    render();
  }
  function render() {
    hideTip();
    if (state.tab === "model") { renderModel(); }
    else if (state.tab === "head") { renderHeadView(); }
    else { select(state.query); }
  }
  function step(id, by) {
    var s = $(id), k = Math.max(0, Math.min(s.options.length - 1, s.selectedIndex + by));
    if (k !== s.selectedIndex) { s.selectedIndex = k; s.dispatchEvent(new Event("change")); }
  }

  $("view").addEventListener("change", function (e) {
    state.view = Number(e.target.value); state.query = null; state.pinned = false;
    state.focus = null; state.focusPinned = false; state.shown = null;
    fillSelectors(); renderTokens(); render();
  });
  $("layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); render(); });
  $("head").addEventListener("change", function (e) { state.head = e.target.value; render(); });
  $("scale").addEventListener("change", function (e) { state.scale = e.target.value; render(); });
  $("heatmap").addEventListener("mousemove", function (e) {
    var at = cellAt(e), canvas = $("heatmap"), d = canvas.dataset;
    if (at === null) { hideTip(); return; }
    if (!state.pinned && at.i !== state.query) { select(at.i); }
    cellTip(e, state.layer, state.head, matrix(state.layer, state.head), view(), at);
    mark(canvas, Number(d.left) + at.j * Number(d.cellWidth), Number(d.top) + at.i * Number(d.cellHeight),
         Number(d.cellWidth), Number(d.cellHeight));
  });
  $("heatmap").addEventListener("mouseleave", hideTip);
  $("heatmap").addEventListener("click", function (e) { var at = cellAt(e); if (at !== null) { pin(at.i); } });
  $("model-grid").addEventListener("mousemove", function (e) {
    var panel = panelOf(e), at = panel && panelCell(panel, e);
    if (!at) { hideTip(); return; }
    var l = Number(panel.dataset.layer), h = Number(panel.dataset.head), v = view();
    var canvas = panel.querySelector("canvas"), w = canvas.clientWidth / v.keys.length;
    var ht = canvas.clientHeight / v.queries.length;
    cellTip(e, l, h, v.weights[l][h], v, at);
    mark(canvas, at.j * w, at.i * ht, w, ht);
  });
  $("model-grid").addEventListener("mouseleave", hideTip);
  $("model-grid").addEventListener("click", function (e) { var p = panelOf(e); if (p) { openLarge(p); } });
  $("model-grid").addEventListener("keydown", function (e) {
    var p = panelOf(e);
    if (p && (e.key === "Enter" || e.key === " ")) { openLarge(p); e.preventDefault(); }
  });
  TABS.forEach(function (t) { $("tab-" + t).addEventListener("click", function () { setTab(t); }); });
  headViewEvents();

  document.addEventListener("keydown", function (e) {
    var tag = e.target.tagName;
    if (tag === "SELECT" || tag === "INPUT" || tag === "TEXTAREA" || e.altKey || e.ctrlKey || e.metaKey) { return; }
    var k = TABS.indexOf(state.tab);
    var sideways = e.key === "ArrowLeft" || e.key === "ArrowRight", back = e.key === "ArrowLeft" || e.key === "ArrowUp";
    if (sideways && e.target.getAttribute && e.target.getAttribute("role") === "tab") {
      setTab(TABS[(k + (back ? 2 : 1)) % 3]); $("tab-" + state.tab).focus();
    } else if (e.key === "1" || e.key === "2" || e.key === "3") { setTab(TABS[Number(e.key) - 1]); }
    else if (e.key === "Escape") {
      state.pinned = false; state.focusPinned = false; state.focus = null;
      if (state.tab === "head") { focusLines(); } else if (state.tab === "matrix") { select(null); }
    }
    else if (sideways && state.tab === "matrix") { step("head", back ? -1 : 1); }
    else if ((e.key === "ArrowUp" || e.key === "ArrowDown") && state.tab !== "model") { step("layer", back ? -1 : 1); }
    else { return; }
    e.preventDefault();
  });
  window.addEventListener("hashchange", function () {  // a link or the address bar: #model, #head, #matrix
    var name = window.location.hash.slice(1);
    if (TABS.indexOf(name) >= 0 && name !== state.tab) { setTab(name); }
  });
  var resizing = null;
  window.addEventListener("resize", function () { clearTimeout(resizing); resizing = setTimeout(render, 120); });

  data.views.forEach(function (v, k) { option($("view"), k, v.label); });
  $("view").value = String(state.view);
  $("view-control").hidden = data.views.length < 2;
  $("meta").textContent = data.model + " \u2014 " + JSON.stringify(data.text) +
    (data.target ? " \u2192 " + JSON.stringify(data.target) : "");
  fillSelectors(); renderTokens();
  var asked = (window.location.hash || "").slice(1);
  // The tab: the one in the address (#model, #head, #matrix), else what --layer/--head asked for.
  if (TABS.indexOf(asked) < 0) {
    asked = start.head !== undefined ? "matrix" : start.layer !== undefined ? "head" : "model";
  }
  setTab(asked);
  document.body.dataset.ready = "1";
})();
"""

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
