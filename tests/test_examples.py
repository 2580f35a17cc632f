"""The course's exercises in examples/: their numbers, checked against independent computations."""

from __future__ import annotations

import importlib.util
import math
import runpy
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from conftest import assert_picture

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name: str) -> ModuleType:
    """Import examples/<name>.py (examples/ is not a package) under the name example_<name>."""
    module_name = f"example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def plain_softmax(scores: np.ndarray) -> np.ndarray:
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# --- seed 000 Q1: Juventus / Ajax --------------------------------------------------------------


def test_juventus_first_pass_by_hand() -> None:
    juv = load("attention_juventus")
    # "they" = [0, 1] scores 1/sqrt(3) with itself and with the adjective, 0 with the 7 other words.
    e = math.exp(1 / math.sqrt(3))
    expected = np.full(9, 1 / (7 + 2 * e))
    expected[[5, 8]] = e / (7 + 2 * e)
    for adjective, sign in [("strong", -1), ("weak", 1)]:
        (out1, w1), _ = juv.attend_twice(adjective)
        np.testing.assert_allclose(w1[juv.THEY], expected, atol=1e-12)
        np.testing.assert_allclose(out1[juv.THEY], [sign * e / (7 + 2 * e), 2 * e / (7 + 2 * e)], atol=1e-12)
        assert w1[juv.THEY, 0] == pytest.approx(w1[juv.THEY, 3])  # one pass: teams tied


def test_juventus_second_pass_resolves_they() -> None:
    juv = load("attention_juventus")
    assert juv.antecedent("strong") == "Ajax"
    assert juv.antecedent("weak") == "Juventus"
    (_, _), (_, w2) = juv.attend_twice("strong")
    assert w2[juv.THEY, 3] == pytest.approx(0.113, abs=5e-4)  # Ajax
    assert w2[juv.THEY, 0] == pytest.approx(0.107, abs=5e-4)  # Juventus
    # same answer without scaling, and with the other reading of "too" = [0, 1]
    too = {**juv.VECTORS, "too": [0.0, 1.0]}
    for scaled in (True, False):
        assert juv.antecedent("strong", scaled, too) == "Ajax"
        assert juv.antecedent("weak", scaled, too) == "Juventus"
        assert juv.antecedent("strong", scaled) == "Ajax"
        assert juv.antecedent("weak", scaled) == "Juventus"


# --- seed 000 Q2: multi-head walkthrough -------------------------------------------------------


def test_walkthrough_shapes_and_reference() -> None:
    mw = load("multihead_walkthrough")
    w = mw.walkthrough(s=4, e=8, h=2, m_qk=3, m_v=5)
    shapes = {name: value.shape for name, _, value in w.steps}
    assert shapes["X"] == (4, 8)
    assert shapes["W_Q^1"] == shapes["W_K^2"] == (3, 8)
    assert shapes["W_V^2"] == (5, 8)
    assert shapes["Q_1"] == shapes["K_2"] == (4, 3)
    assert shapes["V_1"] == (4, 5)
    assert shapes["scores_1"] == shapes["A_2"] == (4, 4)
    assert shapes["head_2"] == (4, 5)
    assert shapes["concat"] == (4, 10)
    assert shapes["W_O"] == (8, 10)
    assert shapes["output"] == (4, 8)
    assert mw.check_against_reference(w, 2) < 1e-12


def test_walkthrough_against_einsum() -> None:
    mw = load("multihead_walkthrough")
    w = mw.walkthrough()
    x, p = w.steps[0][2], w.stacked
    q = np.einsum("se,hqe->hsq", x, p["w_q"].reshape(2, 3, 8))
    k = np.einsum("se,hqe->hsq", x, p["w_k"].reshape(2, 3, 8))
    v = np.einsum("se,hve->hsv", x, p["w_v"].reshape(2, 5, 8))
    a = plain_softmax(np.einsum("hsq,htq->hst", q, k) / math.sqrt(3))
    heads = np.einsum("hst,htv->shv", a, v).reshape(4, 10)
    np.testing.assert_allclose(w.output, heads @ p["w_o"].T, atol=1e-12)
    np.testing.assert_allclose(w.weights, a, atol=1e-12)


# --- seed 002 computer assignment: H = 1 vs H = 3 ------------------------------------------------


def test_h1_and_h3_differ() -> None:
    hh = load("heads_h1_vs_h3")
    x, w_q, w_k, _ = hh.make_inputs()
    out1, weights1 = hh.attend(x, 1)
    out3, weights3 = hh.attend(x, 3)
    assert weights1.shape == (1, 5, 5) and weights3.shape == (3, 5, 5)
    assert np.abs(out1 - out3).max() > 0.1
    # head 2 of H=3 by hand: rows 2..3 of W_q and W_k, scale 1/sqrt(2)
    q, k = x @ w_q[2:4].T, x @ w_k[2:4].T
    np.testing.assert_allclose(weights3[1], plain_softmax(q @ k.T / math.sqrt(2)), atol=1e-12)
    np.testing.assert_allclose(weights1[0], plain_softmax((x @ w_q.T) @ (x @ w_k.T).T / math.sqrt(6)))


@pytest.mark.parametrize("n_heads", [1, 3])
def test_swapping_inputs_swaps_outputs(n_heads: int) -> None:
    hh = load("heads_h1_vs_h3")
    x, *_ = hh.make_inputs()
    out, _ = hh.attend(x, n_heads)
    out_swapped, _ = hh.attend(x[[1, 0, 2, 3, 4]], n_heads)
    np.testing.assert_allclose(out_swapped[0], out[1], atol=1e-12)
    np.testing.assert_allclose(out_swapped[1], out[0], atol=1e-12)
    np.testing.assert_allclose(out_swapped[2:], out[2:], atol=1e-12)


# --- seed 001 problem 6: merged query-key matrix -----------------------------------------------


def test_merged_matrix_gives_same_attention() -> None:
    mq = load("merged_query_key")
    factored, merged = mq.attention_both_ways(n_tokens=6, j=32, i=8)
    assert np.abs(factored - merged).max() < 1e-12
    factored, merged = mq.attention_both_ways(n_tokens=8, j=768, i=64)
    assert np.abs(factored - merged).max() < 1e-12
    assert factored.max() > 0.3  # not a trivially uniform attention


def test_merged_parameter_counts() -> None:
    mq = load("merged_query_key")
    assert mq.parameter_counts(768, 64) == (98_304, 589_824)
    two_ij, j_sq = mq.parameter_counts(768, 384)
    assert two_ij == j_sq  # equal at I = J/2


# --- seed 002 1a/1c, seed 003: positional encodings ---------------------------------------------


def test_one_hot_orthogonal_only_while_n_le_d() -> None:
    pe = load("positional_encodings")
    np.testing.assert_array_equal(pe.one_hot_gram(4, 6), np.eye(4))
    np.testing.assert_array_equal(pe.one_hot_gram(6, 6), np.eye(6))
    with pytest.raises(ValueError):
        pe.one_hot_gram(7, 6)


def test_sinusoidal_shift_is_linear_and_dots_depend_on_offset() -> None:
    pe = load("positional_encodings")
    for k in (1, 3, 17):
        assert pe.shift_error(k) < 1e-12
    gram, closed = pe.offset_dot_products(n=50, d=128)
    np.testing.assert_allclose(gram, closed, atol=1e-10)
    assert gram[0, 1] == pytest.approx(gram[30, 31])
    # M_1 acting on the first pair is a rotation by 1 radian (w_0 = 1)
    m = pe.shift_matrix(1, 4)
    np.testing.assert_allclose(m[:2, :2], [[math.cos(1), math.sin(1)], [-math.sin(1), math.cos(1)]])
    np.testing.assert_allclose(m @ m.T, np.eye(4), atol=1e-12)


def test_sinusoidal_png_written(tmp_path: Path) -> None:
    pe = load("positional_encodings")
    path = pe.save_heatmap(tmp_path / "pe.png")
    assert_picture(path, min_colours=20)  # a heatmap: many shades


# --- seed 000 Q5: LoRA ----------------------------------------------------------------------------


def test_lora_ratio() -> None:
    lora = load("lora_ratio")
    assert lora.full_parameters(200, 50) == 10_000
    assert lora.lora_parameters(200, 50, 5) == 1_250
    assert lora.lora_ratio(200, 50, 5) == 0.125
    assert lora.merged_equals_adapter(200, 50, 5) < 1e-10


# --- seed 000 Q7/Q8: cross-modal search -------------------------------------------------------------


def test_cross_modal_best_sentences_by_hand() -> None:
    cm = load("cross_modal_search")
    images = np.array(
        [
            [0.12 - 1.95 + 0.48 + 0.12, 0.06 - 0.45 + 0.12 + 0.12, -0.04 + 0.9 - 0.18 + 0.21],
            [-0.24 - 0.65 + 0.96 - 0.04, -0.12 - 0.15 + 0.24 - 0.04, 0.08 + 0.3 - 0.36 - 0.07],
        ]
    )  # I W_i, row by row
    sentences = np.array(
        [
            [-1.08 + 0.12, 0.45 - 0.03, 0.72 - 0.48],
            [0.96 - 0.04, -0.4 + 0.01, -0.64 + 0.16],
            [-0.36 - 0.2, 0.15 + 0.05, 0.24 + 0.8],
        ]
    )  # T W_t
    got_images, got_sentences = cm.project()
    np.testing.assert_allclose(got_images, images, atol=1e-12)
    np.testing.assert_allclose(got_sentences, sentences, atol=1e-12)
    scores = images @ sentences.T
    np.testing.assert_allclose(cm.dot_scores(), scores, atol=1e-12)
    np.testing.assert_allclose(scores, [[1.3314, -1.5003, 1.5844], [-0.0702, 0.0789, -0.0828]], atol=1e-12)
    assert cm.best_sentences(cm.dot_scores()) == [3, 2]
    assert cm.best_sentences(cm.cosine_scores()) == [3, 2]


def test_cross_attention_reuses_projections() -> None:
    cm = load("cross_modal_search")
    updated, weights = cm.cross_attention()
    assert updated.shape == (2, 4) and weights.shape == (1, 2, 3)
    np.testing.assert_allclose(weights[0], plain_softmax(cm.dot_scores() / math.sqrt(3)), atol=1e-12)
    assert cm.best_sentences(weights[0]) == [3, 2]


# --- seed 000 Q9: LSTM ----------------------------------------------------------------------------


def test_lstm_from_given_gates() -> None:
    lstm = load("lstm_cell")
    c, h = lstm.from_gates()
    np.testing.assert_allclose(c, [0.9 * 0.5 + 0.6 * 0.4, 0.2 * -1.0 + 0.8 * -0.5], atol=1e-12)
    np.testing.assert_allclose(c, [0.69, -0.6], atol=1e-12)
    np.testing.assert_allclose(h, [0.7 * math.tanh(0.69), 0.3 * math.tanh(-0.6)], atol=1e-12)
    np.testing.assert_allclose(h, [0.4186, -0.1611], atol=1e-4)


def test_lstm_full_step_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    lstm = load("lstm_cell")
    step = lstm.full_step()
    cell = torch.nn.LSTMCell(3, 2, dtype=torch.float64)
    with torch.no_grad():
        w = torch.from_numpy(step["w"])  # (4J, J+I) acting on [h; x]
        cell.weight_hh.copy_(w[:, :2])
        cell.weight_ih.copy_(w[:, 2:])
        cell.bias_hh.zero_()
        cell.bias_ih.zero_()
        h, c = cell(
            torch.from_numpy(step["x"])[None],
            (torch.from_numpy(step["h_prev"])[None], torch.from_numpy(step["c_prev"])[None]),
        )
    np.testing.assert_allclose(step["h"], h[0].numpy(), atol=1e-12)
    np.testing.assert_allclose(step["c"], c[0].numpy(), atol=1e-12)


# --- every script end to end ------------------------------------------------------------------------

KEY_LINES = {
    "attention_juventus.py": ["'they' attends more to Ajax", "'they' attends more to Juventus"],
    "multihead_walkthrough.py": ["concat (4, 10)", "output (4, 8)", "matches reference: True"],
    "heads_h1_vs_h3.py": ["the outputs differ", "output rows 1 and 2 swap, rest unchanged: True"],
    "merged_query_key.py": ["2*I*J = 98,304", "J^2   = 589,824"],
    "positional_encodings.py": ["Gram matrix P P^T is the identity: True", "N=7 D=6: impossible"],
    "lora_ratio.py": ["ratio LoRA/full = 0.125"],
    "cross_modal_search.py": ["image 1: best sentence 3", "image 2: best sentence 2"],
    "lstm_cell.py": ["c_t = f_t*c_t-1 + i_t*C~_t = [ 0.69 -0.6 ]"],
}


def test_demo_lists_every_example() -> None:
    from lmforge.workflows.demo import EXAMPLES as DEMO_EXAMPLES

    assert sorted(DEMO_EXAMPLES) == sorted(KEY_LINES)


@pytest.mark.parametrize("script", sorted(KEY_LINES))
def test_script_runs(
    script: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LMFORGE_OUT", str(tmp_path))
    runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    out = capsys.readouterr().out
    for line in KEY_LINES[script]:
        assert line in out
    if script == "positional_encodings.py":
        assert (tmp_path / "sinusoidal_pe.png").stat().st_size > 1000
