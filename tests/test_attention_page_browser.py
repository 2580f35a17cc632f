"""The HTML attention explorer in a real headless browser: Debian's chromium, driven by selenium.

Needs ``apt-get install chromium chromium-driver`` and ``pip install selenium``; skipped (with the reason)
when either is missing, unless ``LMFORGE_REQUIRE_BROWSER=1`` (for CI), which turns the skip into a failure.
Each check compares what the page shows with the model's own numbers.
"""

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

import lmforge
from lmforge.models import build_model, get_preset, save_pretrained
from lmforge.tokenizers import ByteLevelBPETokenizer, WordPieceTokenizer
from lmforge.viz import write_attention_page
from lmforge.workflows.inspect import attention_maps

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("LMFORGE_REQUIRE_BROWSER") == "1"  # CI sets it: a missing browser fails, not skips


def _missing(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"LMFORGE_REQUIRE_BROWSER=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


try:
    from selenium import webdriver
except ImportError:
    _missing("selenium is not installed (pip install selenium)")
if not (CHROMIUM and CHROMEDRIVER):
    _missing("chromium and chromedriver are not installed (apt-get install chromium chromium-driver)")

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CORPUS = ["Juventus lost from Ajax because they were too strong", "the king spoke to the queen"] * 3
TEXT = "Juventus lost from Ajax because they were too strong"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1280,1000"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """Every test here runs on one torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def browser():
    profile = tempfile.mkdtemp(prefix="lmforge-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={profile}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(20)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


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


def open_page(browser, path: Path):
    browser.get(path.as_uri())
    assert browser.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1"


def choose(browser, select_id: str, value: str):
    Select(browser.find_element(By.ID, select_id)).select_by_value(value)


def hover_query(browser, i: int):
    ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "#queries .tok")[i]).perform()


def shown_weights(browser) -> list[float]:
    """The weights the key tokens display (their data-w), as floats; NaN where nothing is shown."""
    values = [k.get_attribute("data-w") for k in browser.find_elements(By.CSS_SELECTOR, "#keys .tok")]
    return [float(v) if v else float("nan") for v in values]


def pixel(browser, x: int, y: int) -> list[int]:
    return browser.execute_script(
        "return Array.from(document.getElementById('heatmap').getContext('2d').getImageData(arguments[0], "
        "arguments[1], 1, 1).data);", x, y)


def test_hover_shows_the_models_weights_for_the_chosen_layer_and_head(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path)
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
    # Opacity = weight: each key's background alpha is its weight.
    keys = browser.find_elements(By.CSS_SELECTOR, "#keys .tok")
    colours = [k.value_of_css_property("background-color") for k in keys]
    alphas = [float(c.rstrip(")").split(",")[3]) if c.startswith("rgba") else 1.0 for c in colours]
    np.testing.assert_allclose(alphas, mean, atol=6e-3)


def test_click_pins_a_token_and_the_heatmap_draws_the_matrix(browser, pages):
    path, maps = pages["encoder"]
    view = maps.view()
    open_page(browser, path)
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
    cell, left, top = (int(canvas.get_attribute(f"data-{k}")) for k in ("cell", "left", "top"))
    for i, j in [(0, 0), (3, 4), (5, 1), (len(view.queries) - 1, len(view.keys) - 1)]:
        r, _, _, a = pixel(browser, left + j * cell + cell // 2, top + i * cell + cell // 2)
        expected_red = 255 - (255 - 37) * np.sqrt(view.weights[0, 1, i, j])  # blue, alpha sqrt(w), over white
        assert a == 255 and abs(r - expected_red) <= 3, (i, j, r, expected_red)


def test_decoder_page_is_causal(browser, pages):
    path, maps = pages["decoder"]
    view = maps.view()
    open_page(browser, path)
    hover_query(browser, 0)
    shown = shown_weights(browser)
    assert shown[0] == 1.0 and shown[1:] == [0.0] * (len(shown) - 1)
    last = len(view.queries) - 1
    hover_query(browser, last)
    np.testing.assert_allclose(shown_weights(browser), view.weights[0, 0, last], atol=6e-4)


def test_seq2seq_page_switches_between_encoder_decoder_and_cross_attention(browser, pages):
    path, maps = pages["seq2seq"]
    open_page(browser, path)
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
    assert [Select(browser.find_element(By.ID, k)).first_selected_option.get_attribute("value")
            for k in ("view", "layer", "head")] == ["2", "1", "3"]
    hover_query(browser, 1)
    np.testing.assert_allclose(shown_weights(browser), maps.views["cross"].weights[1, 3, 1], atol=6e-4)
