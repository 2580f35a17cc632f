// The attention explorer's script (lmforge/viz/explorer_page.py inlines it into each page, after filling
// its placeholders from the constants there). Plain ES5, no external resource.
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
