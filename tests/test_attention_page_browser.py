"""The HTML attention explorer in a real headless browser: Debian's chromium, driven by selenium.

Needs ``apt-get install chromium chromium-driver`` and ``pip install selenium``; skipped (with the reason)
when either is missing, unless ``LMFORGE_REQUIRE_BROWSER=1`` (for CI), which turns the skip into a failure.
Each check compares what the page shows with the model's own numbers: the model view's panels (one per
layer x head, coloured by the page's ramp, the weight on hover to 4 decimals), the head view's lines (one
per weight of at least 0.01, opacity = weight, colour = head) and the matrix (keys painted, heatmap cells,
hover, pinning, keys on the keyboard).
"""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import lmforge
from lmforge.models import build_model, get_preset, save_pretrained
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.viz import page_data, write_attention_page
from lmforge.viz.explorer_page import HEAD_COLOURS, LINE_THRESHOLD, MASKED, RAMP
from lmforge.workflows.inspect import attention_maps

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("LMFORGE_REQUIRE_BROWSER") == "1"  # CI sets it: a missing browser fails, not skips


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"LMFORGE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    from selenium import webdriver  # noqa: F401  (the availability check)
except ImportError:
    _missing("selenium is not installed (pip install selenium)")
if not (CHROMIUM and CHROMEDRIVER):
    _missing("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")

from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

from conftest import headless_chromium  # noqa: E402

CORPUS = ["Juventus lost from Ajax because they were too strong", "the king spoke to the queen"] * 3
TEXT = "Juventus lost from Ajax because they were too strong"


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def browser():
    yield from headless_chromium(CHROMIUM, CHROMEDRIVER)


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{kind: (page path, AttentionMaps)} for a tiny encoder (4 heads), decoder and encoder-decoder."""
    root = tmp_path_factory.mktemp("pages")
    wp = WordPieceTokenizer.train(CORPUS, vocab_size=120, min_frequency=1)
    bb = ByteLevelBPETokenizer.train(CORPUS, vocab_size=290, min_frequency=1)
    out = {}
    for kind, preset, tok, extra in (("encoder", "bert-tiny", wp, {}), ("decoder", "gpt-tiny", bb, {}),
                                     ("seq2seq", "seq2seq-tiny", wp, {"bos_id": wp.cls_id, "eos_id": wp.sep_id})):
        torch.manual_seed(1)
        config = get_preset(preset, vocab_size=tok.vocab_size, max_positions=64, **extra)
        model = build_model(config).eval()
        with torch.no_grad():  # sharper attention than a fresh model's near-uniform rows: heads differ visibly
            for name, p in model.named_parameters():
                if name.endswith(("in_proj.weight", "q_proj.weight", "kv_proj.weight")):
                    p.mul_(40.0)
        model_dir = save_pretrained(model, root / kind, tok)
        model, tokenizer = lmforge.load(model_dir)
        maps = attention_maps(model, tokenizer, TEXT, target="the queen spoke" if kind == "seq2seq" else None)
        out[kind] = (write_attention_page(maps, root / f"{kind}.html", model_name=kind), maps)
    return out


def open_page(browser, path: Path, tab: str = ""):
    """Load the page, on ``tab`` ("model", "head", "matrix") when given, else on the one it chooses itself."""
    browser.get(path.as_uri() + (f"#{tab}" if tab else ""))
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"


def current_tab(browser) -> str:
    (tab,) = [t.get_attribute("id") for t in browser.find_elements(By.CSS_SELECTOR, "[role=tab]")
              if t.get_attribute("aria-selected") == "true"]
    return tab.removeprefix("tab-")


def rgb(hex_colour: str) -> np.ndarray:
    return np.array([int(hex_colour[k:k + 2], 16) for k in (1, 3, 5)], dtype=float)


def ramp(t: float) -> np.ndarray:
    """What the page's colour ramp gives for t in [0, 1]: linear between the stops of RAMP."""
    stops = np.array([rgb(h) for h in RAMP])
    t = min(max(t, 0.0), 1.0) * (len(stops) - 1)
    k = min(int(t), len(stops) - 2)
    return stops[k] + (stops[k + 1] - stops[k]) * (t - k)


def weight_colour(w: float) -> np.ndarray:
    return ramp(np.sqrt(w))  # the square-root scale


def luminance(colour: np.ndarray) -> float:
    """WCAG relative luminance of an sRGB colour (0..255 channels)."""
    c = np.asarray(colour, dtype=float) / 255
    lin = np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)
    return float(lin @ [0.2126, 0.7152, 0.0722])


def contrast(a: np.ndarray, b: np.ndarray) -> float:
    la, lb = sorted([luminance(a), luminance(b)], reverse=True)
    return (la + 0.05) / (lb + 0.05)


def css_rgb(value: str) -> np.ndarray:
    """'rgb(1, 2, 3)' or 'rgba(1, 2, 3, 1)' -> [1, 2, 3]."""
    return np.array([float(x) for x in value[value.index("(") + 1:-1].split(",")[:3]])


def tooltip(browser) -> str:
    tip = browser.find_element(By.ID, "tip")
    assert tip.is_displayed()
    return tip.text


def press(browser, key: str):
    ActionChains(browser).send_keys(key).perform()


def choose(browser, select_id: str, value: str):
    Select(browser.find_element(By.ID, select_id)).select_by_value(value)


def hover_query(browser, i: int):
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "#queries .tok")[i]).perform()


def shown_weights(browser) -> list[float]:
    """The weights the key tokens display (their data-w), as floats; NaN where nothing is shown."""
    values = [k.get_attribute("data-w") for k in browser.find_elements(By.CSS_SELECTOR, "#keys .tok")]
    return [float(v) if v else float("nan") for v in values]


def pixel(browser, x: float, y: float, canvas=None) -> list[int]:
    """The RGBA of the canvas pixel at CSS position (x, y) of ``canvas`` (default: the heatmap)."""
    canvas = canvas or browser.find_element(By.ID, "heatmap")
    return browser.execute_script(
        "var c = arguments[0], r = c.width / c.getBoundingClientRect().width;"
        "return Array.from(c.getContext('2d').getImageData(Math.floor(arguments[1] * r), Math.floor(arguments[2] * r),"
        " 1, 1).data);", canvas, x, y)


def hover_at(browser, element, x: float, y: float):
    """Move the mouse to (x, y) px from the element's top-left corner."""
    size = element.size
    ActionChains(browser).move_to_element_with_offset(element, int(x - size["width"] / 2),
                                                      int(y - size["height"] / 2)).perform()


def embedded(path: Path) -> dict:
    """The page's own data: {view name: weights (L, H, Tq, Tk) at 4 decimals}."""
    return {v["name"]: np.array(v["weights"]) for v in page_data(path.read_text())["views"]}


def test_hover_shows_the_models_weights_for_the_chosen_layer_and_head(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path, "matrix")
    assert not browser.find_element(By.ID, "view-control").is_displayed()  # one view: no selector
    assert [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#queries .tok")] == view.queries
    assert np.isnan(shown_weights(browser)).all()  # nothing selected yet
    query = view.queries.index("they")
    choose(browser, "layer", "1")
    choose(browser, "head", "2")
    hover_query(browser, query)
    first = shown_weights(browser)
    np.testing.assert_allclose(first, view.weights[1, 2, query], atol=6e-4)
    status = browser.find_element(By.ID, "status").text
    top = int(np.argmax(view.weights[1, 2, query]))
    assert status.startswith('layer 1, head 2: "they" attends to') and f'"{view.keys[top]}"' in status
    choose(browser, "head", "3")  # the hovered token stays selected; the weights follow the head
    hover_query(browser, query)
    second = shown_weights(browser)
    np.testing.assert_allclose(second, view.weights[1, 3, query], atol=6e-4)
    assert np.abs(np.array(first) - np.array(second)).max() > 1e-3
    choose(browser, "head", "mean")
    hover_query(browser, 0)
    mean = shown_weights(browser)
    np.testing.assert_allclose(mean, view.weights[1, :, 0].mean(0), atol=1.5e-3)
    # Each key is painted with its weight's colour, its text black or white, whichever contrasts more.
    for key, w in zip(browser.find_elements(By.CSS_SELECTOR, "#keys .tok"), mean, strict=True):
        background = css_rgb(key.value_of_css_property("background-color"))
        assert np.abs(background - weight_colour(w)).max() <= 1.5, (key.text, background, w)
        text = css_rgb(key.value_of_css_property("color"))
        assert text.tolist() in ([0, 0, 0], [255, 255, 255])
        assert contrast(background, text) >= 4.5


def test_click_pins_a_token_and_the_heatmap_draws_the_matrix(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path, "matrix")
    choose(browser, "layer", "0")
    choose(browser, "head", "1")
    queries = browser.find_elements(By.CSS_SELECTOR, "#queries .tok")
    queries[2].click()
    pinned = shown_weights(browser)
    np.testing.assert_allclose(pinned, view.weights[0, 1, 2], atol=6e-4)
    hover_query(browser, 5)  # hovering elsewhere does not move a pinned selection
    assert shown_weights(browser) == pinned
    assert "pinned" in queries[2].get_attribute("class")
    queries[2].click()  # unpin
    hover_query(browser, 5)
    np.testing.assert_allclose(shown_weights(browser), view.weights[0, 1, 5], atol=6e-4)
    canvas = browser.find_element(By.ID, "heatmap")
    cw, ch, left, top = (int(canvas.get_attribute(f"data-{k}")) for k in ("cell-width", "cell-height", "left", "top"))
    for i, j in [(0, 0), (3, 4), (5, 1), (len(view.queries) - 1, len(view.keys) - 1)]:
        # near a cell's top-left corner: inside the selected row's outline, away from the number in the middle
        *colour, alpha = pixel(browser, left + j * cw + 6, top + i * ch + max(6, ch // 4))
        assert alpha == 255 and np.abs(np.array(colour) - weight_colour(view.weights[0, 1, i, j])).max() <= 2, (i, j)
    # Hovering a cell shows its exact weight (the page's 4 decimals) and selects its row.
    weights = embedded(path)["encoder"]
    i, j = 3, 4
    hover_at(browser, canvas, left + j * cw + cw / 2, top + i * ch + ch / 2)
    assert tooltip(browser) == f"layer 0 · head 1\n{view.queries[i]} → {view.keys[j]}: {weights[0, 1, i, j]:.4f}"
    assert abs(weights[0, 1, i, j] - view.weights[0, 1, i, j]) <= 5e-5 + 1e-7
    np.testing.assert_allclose(shown_weights(browser), view.weights[0, 1, i], atol=6e-4)


def test_decoder_page_is_causal(browser, pages):
    path, maps = pages["decoder"]
    view = maps.view()
    open_page(browser, path, "matrix")
    hover_query(browser, 0)
    shown = shown_weights(browser)
    assert shown[0] == 1.0 and shown[1:] == [0.0] * (len(shown) - 1)
    last = len(view.queries) - 1
    hover_query(browser, last)
    np.testing.assert_allclose(shown_weights(browser), view.weights[0, 0, last], atol=6e-4)


def test_seq2seq_page_switches_between_encoder_decoder_and_cross_attention(browser, pages):
    path, maps = pages["seq2seq"]
    open_page(browser, path, "matrix")
    assert browser.find_element(By.ID, "view-control").is_displayed()
    options = Select(browser.find_element(By.ID, "view")).options
    assert [o.text for o in options] == [v.label for v in maps.views.values()]
    for k, name in enumerate(["encoder", "decoder", "cross"]):
        view = maps.views[name]
        choose(browser, "view", str(k))
        choose(browser, "layer", "1")
        choose(browser, "head", "0")
        keys = [s.text for s in browser.find_elements(By.CSS_SELECTOR, "#keys .tok")]
        assert keys == view.keys
        i = len(view.queries) - 1
        hover_query(browser, i)
        np.testing.assert_allclose(shown_weights(browser), view.weights[1, 0, i], atol=6e-4)
    assert browser.find_element(By.ID, "keys-label").text == "encoder"


def test_page_opens_on_the_requested_view_layer_and_head(browser, pages, tmp_path):
    _, maps = pages["seq2seq"]
    page = write_attention_page(maps, tmp_path / "start.html", view="cross", layer=1, head=3)
    open_page(browser, page)
    assert current_tab(browser) == "matrix"  # a head asked for: that head, large
    assert [Select(browser.find_element(By.ID, k)).first_selected_option.get_attribute("value")
            for k in ("view", "layer", "head")] == ["2", "1", "3"]
    hover_query(browser, 1)
    np.testing.assert_allclose(shown_weights(browser), maps.views["cross"].weights[1, 3, 1], atol=6e-4)


def panels(browser):
    return browser.find_elements(By.CSS_SELECTOR, "#model-grid .panel")


@pytest.mark.parametrize("kind", ["encoder", "seq2seq"])
def test_model_view_has_a_panel_per_layer_and_head_and_hover_shows_the_weight(browser, pages, kind):
    path, maps = pages[kind]
    weights = embedded(path)
    open_page(browser, path)
    assert current_tab(browser) == "model"  # no layer or head asked for: every layer and head
    for k, (name, view) in enumerate(maps.views.items()):
        if len(maps.views) > 1:
            choose(browser, "view", str(k))
        n_layers, n_heads, n_q, n_k = view.weights.shape
        shown = panels(browser)
        assert len(shown) == n_layers * n_heads
        assert [(int(p.get_attribute("data-layer")), int(p.get_attribute("data-head"))) for p in shown] == [
            (layer, head) for layer in range(n_layers) for head in range(n_heads)]
        # One canvas pixel per weight, in the ramp's colour (masked cells grey).
        layer, head = n_layers - 1, n_heads - 1
        canvas = shown[layer * n_heads + head].find_element(By.TAG_NAME, "canvas")
        assert (int(canvas.get_attribute("width")), int(canvas.get_attribute("height"))) == (n_k, n_q)
        image = np.array(browser.execute_script(
            "var c = arguments[0]; return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);",
            canvas)).reshape(n_q, n_k, 4)
        expected = np.array([[weight_colour(w) for w in row] for row in view.weights[layer, head]])
        if view.causal:
            expected[np.triu(np.ones((n_q, n_k), bool), 1)] = rgb(MASKED)
        assert np.abs(image[..., :3] - expected).max() <= 2 and (image[..., 3] == 255).all()
        # Hovering a cell of a thumbnail: its layer, head, tokens and weight to 4 decimals.
        i, j = n_q - 1, 0
        box = canvas.size
        hover_at(browser, canvas, (j + 0.5) * box["width"] / n_k, (i + 0.5) * box["height"] / n_q)
        w = weights[name][layer, head, i, j]
        assert tooltip(browser) == f"layer {layer} · head {head}\n{view.queries[i]} → {view.keys[j]}: {w:.4f}"
        assert abs(w - view.weights[layer, head, i, j]) <= 5e-5 + 1e-7
    # Clicking a panel opens that head in the matrix.
    panels(browser)[1].click()
    assert current_tab(browser) == "matrix"
    assert [Select(browser.find_element(By.ID, k)).first_selected_option.get_attribute("value")
            for k in ("layer", "head")] == ["0", "1"]
    assert browser.find_element(By.ID, "heatmap").is_displayed()


def visible_lines(browser) -> list[dict]:
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#lines line')).filter(function (l) {"
        "  return getComputedStyle(l).display !== 'none'; }).map(function (l) {"
        "  return {head: +l.dataset.head, query: +l.dataset.query, key: +l.dataset.key, w: l.dataset.w,"
        "          opacity: +l.getAttribute('stroke-opacity'), width: +l.getAttribute('stroke-width'),"
        "          stroke: l.getAttribute('stroke')}; });")


def expected_lines(weights: np.ndarray, heads) -> set:
    """(head, query, key) of every weight of a layer that the head view draws: at least LINE_THRESHOLD."""
    return {(h, i, j) for h in heads for i, j in zip(*np.nonzero(weights[h] >= LINE_THRESHOLD), strict=True)}


def test_head_view_draws_a_line_per_weight_with_opacity_the_weight(browser, pages):
    path, maps = pages["encoder"]
    view, weights = maps.view(), embedded(path)["encoder"]
    n_heads = view.weights.shape[1]
    open_page(browser, path, "head")
    assert not browser.find_element(By.ID, "head-control").is_displayed()
    choose(browser, "layer", "1")
    lines = visible_lines(browser)
    assert {(x["head"], x["query"], x["key"]) for x in lines} == expected_lines(weights[1], range(n_heads))
    assert len(lines) == len(expected_lines(weights[1], range(n_heads)))  # one line each
    for x in lines:
        w = weights[1, x["head"], x["query"], x["key"]]
        assert x["w"] == f"{w:.4f}" and x["opacity"] == pytest.approx(w, abs=1e-9)
        assert x["width"] == pytest.approx(1 + 3 * w, abs=0.006) and x["stroke"] == HEAD_COLOURS[x["head"]]
    assert len({x["stroke"] for x in lines}) == n_heads  # every head has lines, each in its own colour
    # Head toggles: hide head 2; double-click head 0 to keep it alone; "all" brings them back.
    toggles = {b.get_attribute("data-head"): b for b in browser.find_elements(By.CSS_SELECTOR, "#head-toggles button")
               if b.get_attribute("data-head") is not None}
    toggles["2"].click()
    assert browser.find_element(By.CSS_SELECTOR, "#head-toggles button[data-head='2']").get_attribute(
        "aria-pressed") == "false"
    kept = [h for h in range(n_heads) if h != 2]
    assert {(x["head"], x["query"], x["key"]) for x in visible_lines(browser)} == expected_lines(weights[1], kept)
    ActionChains(browser).double_click(browser.find_element(By.CSS_SELECTOR, "#head-toggles button[data-head='0']")
                                       ).perform()
    assert {x["head"] for x in visible_lines(browser)} == {0}
    browser.find_element(By.CSS_SELECTOR, "#head-toggles button[data-all='all']").click()
    assert len(visible_lines(browser)) == len(expected_lines(weights[1], range(n_heads)))
    # Hovering a query keeps only its lines; the strongest line (drawn on top) shows its weight on hover.
    they = view.queries.index("they")
    queries = browser.find_elements(By.CSS_SELECTOR, "#lines text.q")
    ActionChains(browser).move_to_element(queries[they]).perform()
    mine = visible_lines(browser)
    assert {(x["head"], x["query"], x["key"]) for x in mine} == {
        t for t in expected_lines(weights[1], range(n_heads)) if t[1] == they}
    queries[they].click()  # pinned: stays when the mouse goes to the lines
    top = browser.find_elements(By.CSS_SELECTOR, "#lines line:not(.off)")[-1]
    ActionChains(browser).move_to_element(top).perform()
    h, j = int(top.get_attribute("data-head")), int(top.get_attribute("data-key"))
    assert tooltip(browser) == f"layer 1 · head {h}\nthey → {view.keys[j]}: {weights[1, h, they, j]:.4f}"
    assert weights[1, h, they, j] == weights[1, :, they].max()
    # With the query pinned, hovering a key lists every head's weight for the pair.
    keys = browser.find_elements(By.CSS_SELECTOR, "#lines text.k")
    ActionChains(browser).move_to_element(keys[j]).perform()
    assert tooltip(browser).splitlines() == [f"they → {view.keys[j]}, layer 1"] + [
        f"head {k}: {weights[1, k, they, j]:.4f}" for k in range(n_heads)]
    press(browser, Keys.ESCAPE)  # unpins: every line again
    assert len(visible_lines(browser)) == len(expected_lines(weights[1], range(n_heads)))


def test_cross_attention_head_view_joins_decoder_tokens_to_encoder_tokens(browser, pages):
    path, maps = pages["seq2seq"]
    view, weights = maps.views["cross"], embedded(path)["cross"]
    open_page(browser, path, "head")
    choose(browser, "view", "2")
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#lines text.q")] == view.queries
    assert [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#lines text.k")] == view.keys
    lines = visible_lines(browser)
    assert {(x["head"], x["query"], x["key"]) for x in lines} == expected_lines(weights[0], range(weights.shape[1]))


def test_keyboard_switches_tabs_heads_and_layers(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path)
    press(browser, "3")
    assert current_tab(browser) == "matrix"
    press(browser, Keys.ARROW_RIGHT)
    press(browser, Keys.ARROW_DOWN)
    assert [Select(browser.find_element(By.ID, k)).first_selected_option.get_attribute("value")
            for k in ("layer", "head")] == ["1", "1"]
    queries = browser.find_elements(By.CSS_SELECTOR, "#queries .tok")
    queries[4].send_keys(Keys.ENTER)  # a query token pins with Enter
    assert "pinned" in queries[4].get_attribute("class")
    np.testing.assert_allclose(shown_weights(browser), view.weights[1, 1, 4], atol=6e-4)
    press(browser, Keys.ESCAPE)
    assert "pinned" not in queries[4].get_attribute("class")
    press(browser, "2")
    assert current_tab(browser) == "head" and browser.find_element(By.ID, "lines").is_displayed()
    press(browser, "1")
    assert current_tab(browser) == "model" and len(panels(browser)) == view.weights.shape[0] * view.weights.shape[1]
    panels(browser)[3].send_keys(Keys.ENTER)  # a panel opens with Enter
    assert current_tab(browser) == "matrix"


def test_page_opens_on_the_head_view_when_only_a_layer_is_asked_for(browser, pages, tmp_path):
    maps = pages["encoder"][1]
    open_page(browser, write_attention_page(maps, tmp_path / "layer.html", layer=1))
    assert current_tab(browser) == "head"
    assert Select(browser.find_element(By.ID, "layer")).first_selected_option.get_attribute("value") == "1"


def test_matrix_uses_the_window(browser, pages):
    """The heatmap fills the window: its cells grow until the window's width or height is used."""
    path = pages["encoder"][0]
    open_page(browser, path, "matrix")
    canvas = browser.find_element(By.ID, "heatmap")
    width, height = canvas.size["width"], canvas.size["height"]
    inner_w, inner_h = browser.execute_script("return [window.innerWidth, window.innerHeight];")
    assert width >= 0.6 * inner_w or height >= 0.6 * inner_h, (width, height, inner_w, inner_h)
    assert int(canvas.get_attribute("data-cell-height")) >= 28


def test_colour_scale_shows_the_ramp_with_its_ticks_and_follows_the_scale_selector(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path)
    for scale, position in (("sqrt", np.sqrt), ("linear", lambda w: w)):
        choose(browser, "scale", scale)
        legend = browser.find_element(By.ID, "model-legend")
        assert ("square-root" if scale == "sqrt" else "linear") in legend.text
        bar = legend.find_element(By.TAG_NAME, "canvas")
        length = int(bar.get_attribute("width"))
        for p in (0.0, 0.3, 0.75, 1.0):  # the bar runs along the ramp, 0 on the left
            colour = browser.execute_script(
                "return Array.from(arguments[0].getContext('2d').getImageData(arguments[1], 5, 1, 1).data);",
                bar, round(p * (length - 1)))
            assert np.abs(np.array(colour[:3]) - ramp(p)).max() <= 2, (scale, p)
        left = bar.location["x"]
        for tick in legend.find_elements(By.CSS_SELECTOR, ".ticks span"):
            middle = tick.location["x"] + tick.size["width"] / 2 - left
            assert abs(middle - position(float(tick.text)) * (length - 1)) <= 2, (scale, tick.text)
        # The thumbnails follow the scale.
        canvas = panels(browser)[0].find_element(By.TAG_NAME, "canvas")
        first = browser.execute_script(
            "return Array.from(arguments[0].getContext('2d').getImageData(0, 0, 1, 1).data);", canvas)
        assert np.abs(np.array(first[:3]) - ramp(position(view.weights[0, 0, 0, 0]))).max() <= 2, scale
