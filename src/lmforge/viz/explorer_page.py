"""The attention explorer's page: HTML skeleton, inline CSS and plain JavaScript, no external resource.

``lmforge.viz.explorer.attention_page`` fills ``PAGE`` with a title and the JSON of the weights. The
script reads that JSON from ``<script type="application/json" id="attention-data">``, whose shape is::

    {"title": "...", "model": "...", "text": "...", "target": null, "start": {"view": 0, "layer": 3, "head": 1},
     "views": [{"name": "encoder", "label": "encoder self-attention", "causal": false,
                "queries": ["[CLS]", ...], "keys": ["[CLS]", ...],
                "weights": [[[[0.512, 0.03, ...], ...]]]}]}        # [layer][head][query][key], 3 decimals

What the page does: the view, layer and head selectors pick one (Tq, Tk) matrix ("mean" averages the
heads). Hovering a query token paints every key token with opacity = its weight (the exact weight is in
the key's ``data-w`` attribute and tooltip) and lists the three largest in the status line; clicking
pins the token (click again to unpin). The canvas draws the whole matrix, each cell blue with
alpha = sqrt(weight) over white (the PNGs' square-root scale), the current query's row outlined;
hovering a cell selects its row.
"""

STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.2em 2em; color: #1f2328;
       max-width: 1100px; }
h1 { font-size: 1.35em; margin: 0 0 .2em; }
.meta { color: #59636e; margin: 0 0 .8em; }
.controls { display: flex; gap: 1.2em; flex-wrap: wrap; align-items: center; margin-bottom: .6em; }
.controls label { font-weight: 600; }
.controls select { font: inherit; margin-left: .3em; }
.hint { color: #59636e; font-size: .9em; margin: .2em 0 .8em; }
.row { display: flex; align-items: baseline; gap: .8em; margin: .5em 0; }
.row-label { width: 5.5em; flex: none; color: #59636e; font-size: .85em; text-align: right; }
.tokens { display: flex; flex-wrap: wrap; gap: 4px; }
.tok { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; padding: 2px 5px;
       border: 1px solid #d0d7de; border-radius: 4px; cursor: pointer; background: #ffffff; white-space: pre; }
.tok.query:hover { border-color: #0969da; }
.tok.active { border-color: #cf222e; box-shadow: 0 0 0 2px #cf222e55; }
.tok.pinned { border-color: #cf222e; box-shadow: 0 0 0 3px #cf222e; }
#status { min-height: 1.5em; margin: .6em 0; font-family: ui-monospace, Menlo, Consolas, monospace; font-size: .9em; }
#heatmap { border: 1px solid #d0d7de; cursor: crosshair; }
"""

SCRIPT = r"""
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("attention-data").textContent);
  var $ = function (id) { return document.getElementById(id); };
  var start = data.start || {};
  var state = { view: start.view || 0, layer: start.layer || 0, head: String(start.head === undefined ? 0 : start.head),
                query: null, pinned: false };
  var CELL_MAX = 28, CANVAS_MAX = 560, BLUE = [37, 99, 235];

  function option(select, value, text) {
    var o = document.createElement("option");
    o.value = String(value); o.textContent = text; select.appendChild(o);
  }
  function view() { return data.views[state.view]; }

  // The (Tq, Tk) matrix of the current layer and head; "mean" averages the heads.
  function matrix() {
    var heads = view().weights[state.layer];
    if (state.head !== "mean") { return heads[Number(state.head)]; }
    return heads[0].map(function (row, i) {
      return row.map(function (_, j) {
        var s = 0; for (var h = 0; h < heads.length; h++) { s += heads[h][i][j]; } return s / heads.length;
      });
    });
  }

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
      var s = document.createElement("span");
      s.className = "tok " + cls; s.textContent = t; s.dataset.index = String(i);
      box.appendChild(s);
    });
    return box;
  }

  function renderTokens() {
    var v = view();
    $("queries-label").textContent = v.name === "cross" ? "decoder" : "query";
    $("keys-label").textContent = v.name === "cross" ? "encoder" : "key";
    var q = tokenRow("queries", v.queries, "query");
    tokenRow("keys", v.keys, "key");
    Array.prototype.forEach.call(q.children, function (s) {
      var i = Number(s.dataset.index);
      s.addEventListener("mouseenter", function () { if (!state.pinned) { select(i); } });
      s.addEventListener("mouseleave", function () { if (!state.pinned) { select(null); } });
      s.addEventListener("click", function () { pin(i); });
    });
  }

  function pin(i) {
    if (state.pinned && state.query === i) { state.pinned = false; select(null); return; }
    state.pinned = true; select(i);
  }

  // Paint the keys of query i (or clear them when i is null), update status and canvas.
  function select(i) {
    state.query = i;
    var v = view(), m = matrix();
    Array.prototype.forEach.call($("queries").children, function (s, k) {
      s.classList.toggle("active", k === i);
      s.classList.toggle("pinned", state.pinned && k === i);
    });
    Array.prototype.forEach.call($("keys").children, function (s, j) {
      if (i === null) {
        s.style.backgroundColor = ""; s.style.color = ""; s.dataset.w = ""; s.title = ""; return;
      }
      var w = m[i][j];
      s.style.backgroundColor = "rgba(" + BLUE.join(",") + "," + w + ")";
      s.style.color = w > 0.5 ? "#ffffff" : "";
      s.dataset.w = w.toFixed(3); s.title = v.keys[j] + ": " + w.toFixed(3);
    });
    var status = $("status");
    if (i === null) { status.textContent = "hover or click a query token"; }
    else {
      var order = m[i].map(function (w, j) { return [w, j]; }).sort(function (a, b) { return b[0] - a[0]; });
      status.textContent = "layer " + state.layer + ", head " + state.head + ": " + JSON.stringify(v.queries[i]) +
        " attends to " + order.slice(0, 3).map(function (p) {
          return JSON.stringify(v.keys[p[1]]) + " " + p[0].toFixed(3);
        }).join(", ");
    }
    draw();
  }

  function cell() {
    var v = view();
    return Math.max(2, Math.min(CELL_MAX, Math.floor(CANVAS_MAX / Math.max(v.queries.length, v.keys.length))));
  }

  // The heatmap: cell (i, j) blue with alpha = sqrt(weight) over white (the PNGs' square-root scale),
  // query tokens written on the left, key tokens on top; the current query's row outlined in red.
  function draw() {
    var v = view(), m = matrix(), c = cell(), canvas = $("heatmap"), ctx = canvas.getContext("2d");
    var font = Math.max(8, Math.min(12, c - 4)) + "px monospace", labels = c >= 8;
    ctx.font = font;
    var width = function (tokens) {
      if (!labels) { return 0; }
      return Math.ceil(Math.max.apply(null, tokens.map(function (t) { return ctx.measureText(t).width; }))) + 8;
    };
    var left = width(v.queries), top = width(v.keys);
    canvas.width = left + v.keys.length * c; canvas.height = top + v.queries.length * c;
    canvas.dataset.cell = String(c); canvas.dataset.left = String(left); canvas.dataset.top = String(top);
    ctx.fillStyle = "#ffffff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = font; ctx.fillStyle = "#1f2328"; ctx.textBaseline = "middle";
    if (labels) {
      ctx.textAlign = "right";
      v.queries.forEach(function (t, i) { ctx.fillText(t, left - 4, top + i * c + c / 2); });
      ctx.save(); ctx.rotate(-Math.PI / 2); ctx.textAlign = "left";
      v.keys.forEach(function (t, j) { ctx.fillText(t, -top + 4, left + j * c + c / 2); });
      ctx.restore();
    }
    for (var i = 0; i < m.length; i++) {
      for (var j = 0; j < m[i].length; j++) {
        ctx.fillStyle = "rgba(" + BLUE.join(",") + "," + Math.sqrt(m[i][j]) + ")";
        ctx.fillRect(left + j * c, top + i * c, c, c);
      }
    }
    if (state.query !== null) {
      ctx.strokeStyle = "#cf222e"; ctx.lineWidth = 2;
      ctx.strokeRect(left + 1, top + state.query * c + 1, v.keys.length * c - 2, c - 2);
    }
  }

  // The query row under the mouse on the heatmap, or -1.
  function rowAt(e) {
    var canvas = $("heatmap"), r = canvas.getBoundingClientRect();
    var y = e.clientY - r.top - Number(canvas.dataset.top), x = e.clientX - r.left - Number(canvas.dataset.left);
    var i = Math.floor(y / cell());
    return x >= 0 && y >= 0 && i < view().queries.length ? i : -1;
  }

  function refresh() { select(state.query); }

  $("view").addEventListener("change", function (e) {
    state.view = Number(e.target.value); state.query = null; state.pinned = false;
    fillSelectors(); renderTokens(); refresh();
  });
  $("layer").addEventListener("change", function (e) { state.layer = Number(e.target.value); refresh(); });
  $("head").addEventListener("change", function (e) { state.head = e.target.value; refresh(); });
  $("heatmap").addEventListener("mousemove", function (e) {
    var i = rowAt(e);
    if (!state.pinned && i >= 0 && i !== state.query) { select(i); }
  });
  $("heatmap").addEventListener("click", function (e) {
    var i = rowAt(e);
    if (i >= 0) { pin(i); }
  });

  data.views.forEach(function (v, k) { option($("view"), k, v.label); });
  $("view").value = String(state.view);
  $("view-control").hidden = data.views.length < 2;
  $("meta").textContent = data.model + " \u2014 " + JSON.stringify(data.text) +
    (data.target ? " \u2192 " + JSON.stringify(data.target) : "");
  fillSelectors(); renderTokens(); refresh();
  document.body.dataset.ready = "1";
})();
"""

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
<div class="controls">
  <label id="view-control">View <select id="view"></select></label>
  <label>Layer <select id="layer"></select></label>
  <label>Head <select id="head"></select></label>
</div>
<p class="hint">Hover a query token to see where it attends (key opacity = attention weight); click to pin it.
Each row of the heatmap is one query; hover a row to select it.</p>
<div class="row"><div class="row-label" id="queries-label">query</div><div class="tokens" id="queries"></div></div>
<div class="row"><div class="row-label" id="keys-label">key</div><div class="tokens" id="keys"></div></div>
<div id="status"></div>
<canvas id="heatmap" width="10" height="10"></canvas>
<script type="application/json" id="attention-data">{data}</script>
<script>{script}</script>
</body>
</html>
"""
