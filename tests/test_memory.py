"""Training in less memory (nn/loss.py, train/recompute.py, train/metrics.py): the LM head and the loss in chunks
of rows, layers that recompute their activations, accuracy from the logits of the scored positions only; each
gives the numbers of the plain computation."""

from __future__ import annotations

import pytest
import torch

from lmforge.models import Decoder
from lmforge.models.config import DecoderConfig
from lmforge.nn.loss import IGNORE_INDEX, chunked_token_loss, token_loss
from lmforge.train.metrics import EvalAccumulator
from lmforge.train.recompute import recompute_layers


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (conftest.py)."""


def tiny_decoder(dropout: float = 0.0) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=61, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=64,
                           max_positions=64, dropout=dropout, attention_dropout=0.0, activation="swiglu",
                           norm="rmsnorm", positions="rotary", bias=False, logit_softcap=15.0)
    return Decoder(config).double()


@pytest.mark.parametrize("rows", [1, 7, 40, 100])  # one row a chunk, chunks that do not divide N, one chunk
def test_chunked_loss_equals_the_plain_loss_values_and_gradients(rows):
    """The head (a soft-capped linear map) and the cross-entropy over chunks of ``rows`` positions, some targets
    ignored: the loss and the gradients of the hidden states and of the head's weight equal the plain ones."""
    torch.manual_seed(0)
    weight = torch.randn(61, 32, dtype=torch.float64, requires_grad=True)
    h = torch.randn(40, 32, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 61, (40,))
    targets[::5] = IGNORE_INDEX

    def head(x):
        return 15.0 * torch.tanh(x @ weight.T / 15.0)

    plain = token_loss(head(h), targets)
    want = torch.autograd.grad(plain, [h, weight])
    logits, chunked = chunked_token_loss(head, h, targets, rows)
    got = torch.autograd.grad(chunked, [h, weight])
    assert (logits is None) == (rows < 40)
    torch.testing.assert_close(chunked, plain, rtol=1e-12, atol=1e-12)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_chunked_loss_in_float32_is_the_plain_loss_to_float_rounding():
    torch.manual_seed(0)
    model = tiny_decoder().float()
    ids = torch.randint(0, 61, (4, 30))
    full = model(ids, labels=ids)
    full.loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    model.loss_chunk_rows = 16  # 116 targets: 8 chunks
    chunked = model(ids, labels=ids, loss_only=True)
    chunked.loss.backward()
    torch.testing.assert_close(chunked.loss, full.loss, rtol=1e-6, atol=1e-6)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[n], rtol=1e-4, atol=1e-6, msg=n)


def saved_bytes(model: Decoder, ids: torch.Tensor) -> tuple[int, torch.Tensor]:
    """(bytes of the tensors autograd keeps for the backward pass, weights excluded; the loss)."""
    weights = {p.data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(ids, labels=ids).loss
    return sum(kept.values()), loss


def test_recomputed_layers_keep_less_and_give_the_same_gradients():
    """Each layer keeps its input only and runs again in the backward pass, under the same random state (dropout
    draws the same masks): the same loss and gradients, under half the saved bytes; weights keep their names."""
    ids = torch.randint(0, 61, (2, 48))
    plain, recomputed = tiny_decoder(dropout=0.1).train(), tiny_decoder(dropout=0.1).train()
    names = list(recomputed.state_dict())
    assert recompute_layers(recomputed) == 3 and recompute_layers(recomputed) == 3  # a second call wraps nothing
    assert list(recomputed.state_dict()) == names
    torch.manual_seed(1)
    kept_plain, loss_plain = saved_bytes(plain, ids)
    loss_plain.backward()
    torch.manual_seed(1)
    kept_recomputed, loss_recomputed = saved_bytes(recomputed, ids)
    loss_recomputed.backward()
    assert kept_recomputed < kept_plain / 2, (kept_recomputed, kept_plain)
    torch.testing.assert_close(loss_recomputed, loss_plain, rtol=0, atol=0)
    for (n, p), q in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-10, atol=1e-12, msg=n)
    with torch.no_grad():  # evaluation: the plain forward, nothing recomputed
        torch.testing.assert_close(recomputed.eval()(ids).logits, plain.eval()(ids).logits)


def test_accuracy_from_the_scored_positions_equals_accuracy_from_every_position():
    """A decoder's ``loss_only`` logits, one row per target in row order, give the evaluation the same accuracy and
    loss as the (B, T, V) logits."""
    model = tiny_decoder().eval()
    ids = torch.randint(0, 61, (3, 20))
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 5:9], labels[2, 12:] = ids[0, 5:9], ids[2, 12:]
    batch = {"input_ids": ids, "labels": labels}
    sums = []
    for options in ({}, {"loss_only": True}):
        acc = EvalAccumulator(shift=1)
        with torch.no_grad():
            acc.update(batch, model(**batch, **options))
        sums.append(acc.result())
    assert set(sums[0]) == set(sums[1]) == {"eval_loss", "eval_ppl", "eval_accuracy"}
    for key in sums[0]:
        assert sums[1][key] == pytest.approx(sums[0][key], rel=1e-12)
