"""GridCaptioner (seed 001 problem 2): shapes, exact properties of attention over a grid, generation, training."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.models import GridCaptioner, GridCaptionerConfig, load_pretrained, save_pretrained
from lmforge.viz import plot_grid_attention

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load_example():
    name = "example_grid_captioning"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / "grid_captioning.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def tiny(positions_2d: bool = True, seed: int = 0) -> GridCaptioner:
    torch.manual_seed(seed)
    cfg = GridCaptionerConfig(vocab_size=12, d_feature=6, grid_x=2, grid_y=3, d_model=16, n_layers=2, n_heads=2,
                              d_ff=32, max_length=10, positions_2d=positions_2d)
    return GridCaptioner(cfg).eval()


def test_forward_shapes_loss_and_weights() -> None:
    model = tiny()
    grid = torch.randn(3, 2, 3, 6)
    ids = torch.randint(3, 12, (3, 5))
    labels = torch.randint(3, 12, (3, 5))
    labels[0, 3:] = -100
    out = model(grid, ids, labels=labels, output_attentions=True)
    assert out.logits.shape == (3, 5, 12)
    assert len(out.cross_attentions) == 2 and out.cross_attentions[0].shape == (3, 2, 5, 6)  # (B, H, T, X·Y)
    for w in out.cross_attentions:
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 5))  # a distribution over the 6 cells
    keep = labels != -100
    torch.testing.assert_close(out.loss, F.cross_entropy(out.logits[keep], labels[keep]))
    # the fused path (no weights) computes the same logits
    torch.testing.assert_close(model(grid, ids).logits, out.logits, atol=1e-5, rtol=1e-5)


def test_flattened_grid_is_the_same_grid_and_bad_shapes_are_named() -> None:
    model = tiny()
    grid = torch.randn(2, 2, 3, 6)
    torch.testing.assert_close(model.encode(grid.flatten(1)).last_hidden_state, model.encode(grid).last_hidden_state)
    with pytest.raises(LmforgeError, match=r"grid must have shape \(batch, 2, 3, 6\)"):
        model.encode(torch.randn(2, 3, 2, 6))


def test_without_2d_positions_the_cells_are_an_unordered_set() -> None:
    """Cross-attention is permutation-invariant over memory: without P2D, shuffling cells changes nothing.

    With P2D a shuffled grid is a different picture, and the logits change.
    """
    grid = torch.randn(2, 2, 3, 6)
    perm = torch.tensor([4, 0, 5, 2, 1, 3])
    shuffled = grid.flatten(1, 2)[:, perm].view(2, 2, 3, 6)
    ids = torch.randint(3, 12, (2, 4))
    plain = tiny(positions_2d=False)
    torch.testing.assert_close(plain(shuffled, ids).logits, plain(grid, ids).logits, atol=1e-5, rtol=1e-5)
    placed = tiny(positions_2d=True)
    assert (placed(shuffled, ids).logits - placed(grid, ids).logits).abs().max() > 1e-3


def test_generate_with_cache_equals_recompute_and_teacher_forcing() -> None:
    """lmforge.generation runs unchanged: the KV cache path equals re-running the prefix, and greedy tokens are the
    argmax of a teacher-forced pass over them."""
    model = tiny()
    grid = torch.randn(3, 2, 3, 6)
    flat = grid.flatten(1)
    cached = generate(model, flat, max_new_tokens=6, stop_ids=[])
    full = generate(model, flat, max_new_tokens=6, stop_ids=[], use_cache=False)
    assert torch.equal(cached.tokens, full.tokens)
    ids = torch.cat([torch.full((3, 1), model.config.bos_id), cached.tokens[:, :-1]], dim=1)
    assert torch.equal(model(grid, ids).logits.argmax(-1), cached.tokens)
    beams = generate(model, flat, max_new_tokens=6, beams=3)
    assert beams.tokens.shape[0] == 3
    maps = model.attention_maps(grid[0], cached.tokens[0].tolist())
    assert maps.shape == (6, 2, 3)
    torch.testing.assert_close(maps.sum(dim=(1, 2)), torch.ones(6))


def test_save_and_load_pretrained_round_trip(tmp_path) -> None:
    model = tiny()
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded, GridCaptioner) and loaded.config == model.config
    grid, ids = torch.randn(2, 2, 3, 6), torch.randint(3, 12, (2, 4))
    torch.testing.assert_close(loaded(grid, ids).logits, model(grid, ids).logits)


def test_plot_grid_attention_writes_a_png(tmp_path) -> None:
    maps = np.random.default_rng(0).dirichlet(np.ones(6), size=3).reshape(3, 2, 3)
    path = plot_grid_attention(maps, ["top", "left", "red"], tmp_path / "a.png", cell_labels={(0, 1): "red"})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(LmforgeError, match="maps must have shape"):
        plot_grid_attention(maps, ["top", "left"], tmp_path / "b.png")


def test_caption_layout_of_the_synthetic_task() -> None:
    ex = load_example()
    layout = ((0, 0, 0, 0), (2, 2, 2, 1))  # red circle top left, blue square bottom right
    assert " ".join(ex.caption_words(layout)) == "top left red circle , bottom right blue square"
    assert ex.object_cells(layout) == [None, None, (0, 0), (0, 0), None, None, None, (2, 2), (2, 2)]
    grid = ex.Task.make(0).render(layout, np.random.default_rng(0))
    assert grid.shape == (3, 3, 16) and np.abs(grid[1, 1]).max() < 0.6 < np.abs(grid[0, 0]).max()


def test_short_training_captions_held_out_grids_and_attends_to_the_named_object(single_thread) -> None:
    """300 steps: held-out captions exactly right, and each colour / shape word's attention peaks on its cell."""
    ex = load_example()
    task = ex.Task.make(0)
    model, seen = ex.train(task, steps=300, seed=0)
    grids, layouts = task.sample(100, np.random.default_rng(123), exclude=seen)
    assert not set(layouts) & seen
    greedy = ex.evaluate(model, grids, layouts)
    assert greedy["exact_match"] >= 0.85, greedy
    assert greedy["attention_peak_on_object"] >= 0.85, greedy
    beam = ex.evaluate(model, grids[:20], layouts[:20], beams=3)
    assert beam["exact_match"] >= 0.85, beam
