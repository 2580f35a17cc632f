"""Dual encoder, InfoNCE, recall@k and CrossModalBlock (seed 000 questions 7 and 8)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.models import CrossModalBlock, DualEncoder, DualEncoderConfig, load_pretrained, save_pretrained
from lmforge.models.dual_encoder import info_nce, mean_pool, recall_at_k, similarity

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# Seed 000 Q7: images I (2 x 4), sentences T (3 x 2), projections W_i (4 x 3), W_t (2 x 3).
I = torch.tensor([[0.2, -1.5, 0.6, 0.3], [-0.4, -0.5, 1.2, -0.1]], dtype=torch.float64)
T = torch.tensor([[0.9, 0.3], [-0.8, -0.1], [0.3, -0.5]], dtype=torch.float64)
W_I = torch.tensor([[0.6, 0.3, -0.2], [1.3, 0.3, -0.6], [0.8, 0.2, -0.3], [0.4, 0.4, 0.7]], dtype=torch.float64)
W_T = torch.tensor([[-1.2, 0.5, 0.8], [0.4, -0.1, -1.6]], dtype=torch.float64)


def load_example(name: str):
    module_name = f"example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def tiny(**kw) -> DualEncoder:
    torch.manual_seed(0)
    cfg = DualEncoderConfig(vocab_size=40, d_model=16, d_embed=8, n_layers=1, n_heads=2, d_ff=32, max_positions=12,
                            dropout=0.0, **kw)
    return DualEncoder(cfg)


# -- question 7: the scores ----------------------------------------------------------------------------
def test_dot_scores_of_the_seed_exercise() -> None:
    """S = (I W_i)(T W_t)^T by hand (the numbers of examples/cross_modal_search.py), best sentences 3 and 2."""
    s = similarity(I @ W_I, T @ W_T, "dot")
    expected = torch.tensor([[1.3314, -1.5003, 1.5844], [-0.0702, 0.0789, -0.0828]], dtype=torch.float64)
    torch.testing.assert_close(s, expected, atol=5e-5, rtol=0)
    assert (s.argmax(1) + 1).tolist() == [3, 2]
    cos = similarity(I @ W_I, T @ W_T, "cosine")
    torch.testing.assert_close(cos, torch.from_numpy(load_example("cross_modal_search").cosine_scores()))
    # the same scores through the model's projections (nn.Linear stores W^T)
    proj = torch.nn.Linear(4, 3, bias=False).double()
    proj.weight.data = W_I.T.clone()
    torch.testing.assert_close(similarity(proj(I), T @ W_T, "dot"), s)


# -- recall@k ------------------------------------------------------------------------------------------
def brute_force_recall(scores: np.ndarray, k: int) -> float:
    """Sort each row's candidates by score, ties placing the correct one last; is it among the first k?"""
    hits = 0
    for i, row in enumerate(scores):
        order = sorted(range(len(row)), key=lambda j: (-row[j], j == i))
        hits += order.index(i) < k
    return hits / len(scores)


def test_recall_at_k_on_a_hand_made_matrix() -> None:
    s = torch.tensor([
        [0.9, 0.1, 0.2, 0.3],   # correct first: rank 1
        [0.5, 0.4, 0.6, 0.1],   # two higher: rank 3
        [0.7, 0.7, 0.7, 0.0],   # tied with two others: counted as rank 3
        [0.8, 0.9, 0.95, 0.1],  # last: rank 4
    ])
    assert recall_at_k(s, ks=(1, 2, 3, 4)) == {1: 0.25, 2: 0.25, 3: 0.75, 4: 1.0}
    assert recall_at_k(torch.zeros(5, 5), ks=(1, 4, 5)) == {1: 0.0, 4: 0.0, 5: 1.0}  # ties count against
    # other targets: row i's partner is column targets[i], with more candidates than queries
    assert recall_at_k(s[:2], ks=(1,), targets=torch.tensor([0, 2])) == {1: 1.0}
    with pytest.raises(LmforgeError, match="pass targets"):
        recall_at_k(torch.zeros(3, 2))


def test_recall_at_k_matches_brute_force_on_random_matrices() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 7, 30):
        scores = rng.integers(0, 4, size=(n, n)).astype(np.float32)  # many ties
        for k in (1, 3, 10):
            assert recall_at_k(torch.from_numpy(scores), ks=(k,))[k] == pytest.approx(brute_force_recall(scores, k))


# -- the loss ------------------------------------------------------------------------------------------
def test_info_nce_is_the_mean_of_both_directions() -> None:
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 1.0, 0.3], [1.5, -0.2, 0.1]])
    by_hand = []
    for m in (logits, logits.T):
        by_hand.append(-np.mean([m[i, i].item() - math.log(m[i].exp().sum().item()) for i in range(3)]))
    assert info_nce(logits).item() == pytest.approx(np.mean(by_hand), abs=1e-6)
    assert info_nce(logits.T).item() == pytest.approx(info_nce(logits).item(), abs=1e-6)  # symmetric
    assert info_nce(torch.eye(3) * 50).item() < 1e-6  # the partners win by far: no loss
    with pytest.raises(LmforgeError):
        info_nce(torch.zeros(2, 3))


def test_mean_pool_ignores_padding() -> None:
    h = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [50.0, 60.0]]])
    assert mean_pool(h, torch.tensor([[1, 1, 0]])).tolist() == [[2.0, 3.0]]


def test_dual_encoder_forward_loss_temperature_and_gradients() -> None:
    model = tiny()
    a, b = torch.randint(1, 40, (4, 6)), torch.randint(1, 40, (4, 5))
    a[0, 4:] = 0  # padding
    out = model(a, b)
    s = similarity(model.embed_a(a), model.embed_b(b), "cosine")
    torch.testing.assert_close(out.logits, s / 0.05)
    torch.testing.assert_close(out.loss, info_nce(s / 0.05))
    out.loss.backward()
    no_grad = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert no_grad == []  # both towers, both projections and the temperature learn
    assert model.log_scale.grad is not None and model.log_scale.grad.abs() > 0  # learned temperature
    fixed = tiny(learn_temperature=False)
    assert "log_scale" not in dict(fixed.named_parameters()) and fixed.temperature == pytest.approx(0.05)
    # padding does not change an embedding
    longer = torch.cat([a, torch.zeros(4, 3, dtype=torch.long)], dim=1)
    model.eval()
    torch.testing.assert_close(model.embed_a(longer), model.embed_a(a), atol=1e-6, rtol=1e-6)


def test_config_validation_and_save_load_round_trip(tmp_path) -> None:
    with pytest.raises(LmforgeError, match="similarity"):
        DualEncoderConfig(vocab_size=10, similarity="l2", d_model=16, n_heads=2).validate()
    model = tiny(share_towers=True).eval()
    assert model.tower_a is model.tower_b
    save_pretrained(model, tmp_path)
    loaded = load_pretrained(tmp_path)
    assert isinstance(loaded, DualEncoder) and loaded.config == model.config
    a = torch.randint(1, 40, (3, 6))
    torch.testing.assert_close(loaded.embed_b(a), model.embed_b(a))


# -- question 8: CrossModalBlock -------------------------------------------------------------------------
def test_cross_modal_block_with_nothing_to_read_changes_nothing() -> None:
    torch.manual_seed(0)
    block = CrossModalBlock(d_model=8, d_memory=6, n_heads=2, d_ff=16)
    x = torch.randn(3, 4, 8)
    y, w = block(x, torch.randn(3, 0, 6), need_weights=True)  # zero-length memory
    assert torch.equal(y, x) and w.shape == (3, 2, 4, 0)
    memory = torch.randn(3, 5, 6)
    mask = torch.ones(3, 5, dtype=torch.long)
    mask[1] = 0  # row 1 has nothing to read
    for need_weights in (False, True):
        y, _ = block(x, memory, mask, need_weights=need_weights)
        assert torch.equal(y[1], x[1])
        assert not torch.allclose(y[0], x[0])  # the others are updated


def test_cross_modal_block_exact_properties_of_attention() -> None:
    """Masked memory positions have zero weight and their contents do not matter; the order of the memory
    does not matter either (attention reads a set)."""
    torch.manual_seed(0)
    block = CrossModalBlock(d_model=8, d_memory=6, n_heads=2, d_ff=16).eval()
    x, memory = torch.randn(2, 3, 8), torch.randn(2, 5, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    y, w = block(x, memory, mask, need_weights=True)
    assert w[0, :, :, 3:].abs().max() == 0
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 2, 3))
    changed = memory.clone()
    changed[0, 3:] = 100.0 * torch.randn(2, 6)
    torch.testing.assert_close(block(x, changed, mask)[0], y)
    perm = torch.tensor([4, 2, 0, 3, 1])
    torch.testing.assert_close(block(x[1:], memory[1:, perm])[0], y[1:], atol=1e-6, rtol=1e-5)


def test_cross_modal_block_gradients_reach_both_modalities() -> None:
    torch.manual_seed(0)
    block = CrossModalBlock(d_model=8, d_memory=6, n_heads=2, d_ff=16)
    x = torch.randn(2, 3, 8, requires_grad=True)
    memory = torch.randn(2, 5, 6, requires_grad=True)
    y, _ = block(x, memory)
    (y ** 2).sum().backward()
    assert x.grad.abs().sum() > 0 and memory.grad.abs().sum() > 0
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in block.parameters())


def test_cross_modal_block_reuses_the_seed_projections() -> None:
    """With W_q = W_i and W_k = W_t (Q8: reused from the search), the attention of each image peaks on the
    sentence the search chose, with weights softmax(S / sqrt(3))."""
    block = CrossModalBlock(d_model=4, d_memory=2, n_heads=1, d_qk=3).double()
    block.norm_x = torch.nn.Identity()  # compare the bare attention with the exercise's numbers
    block.norm_memory = torch.nn.Identity()
    with torch.no_grad():
        block.attn.q_proj.weight.copy_(W_I.T)
        block.attn.q_proj.bias.zero_()
        block.attn.kv_proj.weight[:3].copy_(W_T.T)
        block.attn.kv_proj.bias.zero_()
    _, w = block(I[None], T[None], need_weights=True)
    s = (I @ W_I) @ (T @ W_T).T
    torch.testing.assert_close(w[0, 0], F.softmax(s / math.sqrt(3), dim=-1))
    assert (w[0, 0].argmax(-1) + 1).tolist() == [3, 2]


# -- real data: the Bible en-es pairs --------------------------------------------------------------------
@pytest.mark.slow
def test_short_training_beats_the_untrained_model_on_held_out_books(single_thread) -> None:
    ex = load_example("cross_modal_retrieval")
    tokenizer, data = ex.prepare(tokenizer_pairs=3000, vocab_size=3000, max_len=48, train_pairs=12000)
    (en, es), (en_test, es_test) = data["train"], data["test"]
    assert len(en_test) >= 300
    model = ex.make_model(tokenizer.vocab_size)
    before = ex.evaluate(model, en_test, es_test)
    ex.train(model, en, es, steps=300, batch_size=128, lr=3e-3)
    after = ex.evaluate(model, en_test, es_test)
    for direction in ("en->es", "es->en"):
        assert before[direction][1] < 0.05, before
        assert after[direction][1] > before[direction][1] + 0.15, (before, after)
        assert after[direction][10] > 0.45, after
