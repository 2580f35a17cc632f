"""ELMo's biLM (models/elmo.py): each direction sees only its side, padding is inert, the joint loss is the
paper's, the 2L + 1 representations, pretraining from a recipe, and frozen + scalar-mix fine-tuning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lmforge
from lmforge.errors import LmforgeError
from lmforge.models import BiLM, BiLMConfig, BiLMForTokenClassification, load_pretrained, save_pretrained
from lmforge.models.elmo import ProjectedLSTM, lm_loss
from lmforge.nn.lstm import LSTM
from lmforge.tokenizers import KINDS
from lmforge.train.metrics import count_targets, label_shift
from lmforge.workflows.finetune import FinetuneArgs, finetune, load_finetuned, predict_lines

pytestmark = [pytest.mark.usefixtures("single_thread"),
              pytest.mark.filterwarnings("ignore:LSTM with projections:UserWarning")]

SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "the sun is hot today", "we ate the bread",
             "maybe the cat sat", "perhaps a dog ran", "it could rain today", "we might eat bread"]


def tiny(**kw) -> BiLM:
    torch.manual_seed(0)
    return BiLM(BiLMConfig(vocab_size=40, d_model=8, d_hidden=12, n_layers=2, **kw)).eval()


def states(model: BiLM, ids: torch.Tensor, mask: torch.Tensor | None = None, explicit: bool = False):
    s = model.states(ids, mask, explicit)
    return s.forward, s.backward


# -- each direction sees only its own side -------------------------------------------------------------------
@pytest.mark.parametrize("explicit", [False, True])
def test_forward_lm_never_sees_the_future_and_backward_lm_never_the_past(explicit):
    model, t = tiny(), 4
    ids = torch.randint(1, 40, (3, 9))
    other = ids.clone()
    other[:, t + 1:] = (ids[:, t + 1:] + 7) % 40  # change every token after t
    fwd_a, bwd_a = states(model, ids, explicit=explicit)
    fwd_b, bwd_b = states(model, other, explicit=explicit)
    for a, b in zip(fwd_a, fwd_b, strict=True):
        assert torch.equal(a[:, : t + 1], b[:, : t + 1])  # exact: nothing after t reaches →h at <= t
        assert not torch.equal(a[:, t + 1:], b[:, t + 1:])
    for a, b in zip(bwd_a, bwd_b, strict=True):
        assert not torch.equal(a[:, : t + 1], b[:, : t + 1])  # the backward LM does read them
    other = ids.clone()
    other[:, : t] = (ids[:, : t] + 7) % 40  # change every token before t
    fwd_b, bwd_b = states(model, other, explicit=explicit)
    for a, b in zip(bwd_a, bwd_b, strict=True):
        assert torch.equal(a[:, t:], b[:, t:])  # exact: nothing before t reaches ←h at >= t
    assert all(not torch.equal(a[:, t:], b[:, t:]) for a, b in zip(fwd_a, fwd_b, strict=True))


def test_the_backward_loss_trains_only_the_backward_lstms():
    model = tiny().train()
    ids = torch.randint(0, 40, (2, 6))
    _, _, bwd = lm_loss(*model.lm_logits(model.states(ids)), ids)
    bwd.backward()
    assert all(p.grad is None for p in model.forward_layers.parameters())
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.backward_layers.parameters())
    assert model.embed.weight.grad is not None and model.softmax.weight.grad is not None  # shared Θ_x, Θ_s


# -- padding ---------------------------------------------------------------------------------------------------
def test_padding_has_no_effect_on_real_positions():
    model = tiny()
    rows = [torch.randint(1, 40, (n,)) for n in (7, 4, 1)]
    ids = torch.zeros(3, 7, dtype=torch.long)
    mask = torch.zeros(3, 7, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)], mask[i, : len(r)] = r, 1
    reps = model.representations(ids, mask)
    junk = ids.masked_fill(mask == 0, 33)  # other token ids at the padded positions: exactly the same
    for a, b in zip(reps, model.representations(junk, mask), strict=True):
        assert torch.equal(a, b)
    for i, r in enumerate(rows):  # the same row alone, unpadded
        alone = model.representations(r[None])
        for a, b in zip(reps, alone, strict=True):
            torch.testing.assert_close(a[i, : len(r)], b[0], atol=1e-6, rtol=0)
            assert a[i, len(r):].abs().sum() == 0  # padded positions are 0
    # the explicit step-by-step path agrees on the padded batch
    for a, b in zip(reps, model.representations(ids, mask, explicit=True), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# -- the 2L + 1 representations ---------------------------------------------------------------------------------
def test_hidden_states_are_the_2l_plus_1_representations():
    model = tiny()
    ids = torch.randint(0, 40, (2, 5))
    out = model(ids, output_hidden_states=True)
    s = model.states(ids)
    assert len(out.hidden_states) == 3 and all(h.shape == (2, 5, 16) for h in out.hidden_states)
    x = model.embed(ids)
    assert torch.equal(out.hidden_states[0], torch.cat([x, x], -1))  # layer 0: [x; x]
    for j in (1, 2):
        assert torch.equal(out.hidden_states[j], torch.cat([s.forward[j - 1], s.backward[j - 1]], -1))
    assert torch.equal(out.last_hidden_state, out.hidden_states[-1])
    # residual: layer 2's state is its LSTM's output plus layer 1's state
    lstm_2 = model.forward_layers[1](s.forward[0])
    torch.testing.assert_close(s.forward[1], lstm_2 + s.forward[0], atol=1e-6, rtol=0)


# -- the loss --------------------------------------------------------------------------------------------------
def test_joint_loss_equals_a_direct_computation():
    model = tiny()
    ids = torch.randint(0, 40, (2, 6))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    out = model(ids, mask, labels=ids)
    fwd_logits, bwd_logits = model.lm_logits(model.states(ids, mask))
    terms_f, terms_b = [], []
    for b, n in enumerate(mask.sum(1).tolist()):
        for k in range(1, n):  # -log p(t_k | t_<k): the forward LM at k - 1
            terms_f.append(-torch.log_softmax(fwd_logits[b, k - 1].double(), -1)[ids[b, k]])
        for k in range(n - 1):  # -log p(t_k | t_>k): the backward LM at k + 1
            terms_b.append(-torch.log_softmax(bwd_logits[b, k + 1].double(), -1)[ids[b, k]])
    fwd, bwd = torch.stack(terms_f).mean(), torch.stack(terms_b).mean()
    assert len(terms_f) == len(terms_b) == 5 + 3
    torch.testing.assert_close(out.metrics["forward_loss"].double(), fwd, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.metrics["backward_loss"].double(), bwd, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss.double(), (fwd + bwd) / 2, atol=1e-5, rtol=0)
    assert not torch.isclose(fwd, bwd)  # two different LMs


def test_loss_normalisation_matches_the_trainers_target_count():
    """Micro-batch means weighted by the trainer's counts give the whole batch's loss exactly."""
    model = tiny()
    assert label_shift(model) == 1
    ids = torch.randint(0, 40, (4, 7))
    labels = ids.clone()
    labels[1, 5:] = -100
    labels[3, 2:] = -100  # right padding in the labels, rows of different lengths
    whole = model(ids, labels=labels).loss
    parts = [(model(ids[i: i + 2], labels=labels[i: i + 2]).loss, count_targets({"labels": labels[i: i + 2]}, 1))
             for i in (0, 2)]
    n = sum(c for _, c in parts)
    torch.testing.assert_close(sum(loss * c / n for loss, c in parts), whole, atol=1e-6, rtol=0)
    assert int(n) == 6 + 4 + 6 + 1


# -- the projected LSTM layer -----------------------------------------------------------------------------------
def test_projected_lstm_fused_equals_explicit_and_torch():
    torch.manual_seed(1)
    layer = ProjectedLSTM(5, 8, proj_size=3).double()
    x = torch.randn(2, 6, 5, dtype=torch.double, requires_grad=True)
    fused, explicit = layer(x), layer(x, explicit=True)
    torch.testing.assert_close(fused, explicit, atol=1e-12, rtol=0)
    g_fused = torch.autograd.grad(fused.square().sum(), [x, *layer.parameters()])
    g_explicit = torch.autograd.grad(explicit.square().sum(), [x, *layer.parameters()])
    for a, b in zip(g_fused, g_explicit, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)
    ref = torch.nn.LSTM(5, 8, proj_size=3, batch_first=True).double()
    with torch.no_grad():
        ref.weight_ih_l0.copy_(layer.weight_ih)
        ref.weight_hh_l0.copy_(layer.weight_hh)
        ref.bias_ih_l0.copy_(layer.bias)
        ref.bias_hh_l0.zero_()
        ref.weight_hr_l0.copy_(layer.weight_hr)
    torch.testing.assert_close(ref(x)[0], fused, atol=1e-12, rtol=0)


def test_without_projection_it_is_lmforges_lstm():
    torch.manual_seed(2)
    layer = ProjectedLSTM(4, 6)
    lstm = LSTM(4, 6)
    with torch.no_grad():
        for name in ("weight_ih", "weight_hh", "bias"):
            getattr(lstm.cells[0], name).copy_(getattr(layer, name))
    x = torch.randn(3, 5, 4)
    torch.testing.assert_close(layer(x), lstm(x).output, atol=1e-6, rtol=0)


# -- saving, loading, pretraining ---------------------------------------------------------------------------------
def test_save_and_load_round_trip(tmp_path):
    model = tiny()
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m")
    assert isinstance(loaded, BiLM) and loaded.config == model.config
    assert json.loads((tmp_path / "m" / "config.json").read_text())["kind"] == "bilm"
    ids = torch.randint(0, 40, (2, 5))
    assert torch.equal(model(ids).logits, loaded(ids).logits)
    with pytest.raises(LmforgeError, match="d_hidden"):
        BiLMConfig.from_dict({"vocab_size": 10, "d_hidden": 0})


def test_pretrain_objective_bilm_leaves_a_loadable_biLM(tmp_path):
    from lmforge.workflows.pretrain import pretrain

    text = tmp_path / "t.txt"
    text.write_text("\n".join(SENTENCES * 30) + "\n")
    recipe = {"tokenizer": {"kind": "wordpiece", "vocab_size": 120},
              "data": {"objective": "bilm", "files": [str(text)], "seq_len": 16, "eval_batches": 2, "workers": 1},
              "model": {"d_model": 16, "d_hidden": 24, "n_layers": 2},
              "train": {"max_steps": 30, "batch_size": 8, "lr": 1e-2, "eval_every": 30, "save_every": 0,
                        "log_every": 10, "progress": False, "plot": False, "tensorboard": False}}
    result, model_dir = pretrain(recipe, tmp_path / "run")
    model, tok = lmforge.load(model_dir)
    assert isinstance(model, BiLM) and model.config.d_hidden == 24 and tok.vocab_size == model.config.vocab_size
    ev = result.eval
    assert {"eval_loss", "eval_forward_loss", "eval_backward_loss"} <= set(ev)
    assert ev["eval_loss"] == pytest.approx((ev["eval_forward_loss"] + ev["eval_backward_loss"]) / 2, rel=1e-5)
    assert ev["eval_forward_loss"] < 3.5  # far below log(vocab) on this repetitive text: it learned


# -- fine-tuning with the scalar mix -----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("elmo-ft")
    tok = KINDS["wordpiece"].train(SENTENCES, 120, 1)
    torch.manual_seed(0)
    save_pretrained(BiLM(BiLMConfig(vocab_size=tok.vocab_size, d_model=16, d_hidden=24)), root / "base", tok)
    tagged = [" ".join(f"{w}/{'DT' if w in ('the', 'a') else 'NN'}" for w in s.split()) for s in SENTENCES]
    (root / "tags.txt").write_text("\n".join(tagged * 4) + "\n")
    rows = [("sure" if i < 4 else "unsure", s) for i, s in enumerate(SENTENCES)]
    (root / "cls.csv").write_text("label,text\n" + "\n".join(f"{a},{b}" for a, b in rows * 4) + "\n")
    return root


def test_frozen_mix_trains_only_the_mix_and_the_head_and_reloads_identically(base, tmp_path):
    bilm_before = load_pretrained(base / "base").state_dict()
    args = FinetuneArgs(model=str(base / "base"), task="token-cls", train=str(base / "tags.txt"),
                        eval=str(base / "tags.txt"), strategy="frozen", mix=True, out=str(tmp_path / "o"),
                        lr=3e-2, max_steps=40, batch_size=8, progress=False)
    report = finetune(args)
    assert report["eval"]["accuracy"] > 0.9
    assert report["trainable_params"] == 2 * 16 * 2 + 2 + 3 + 1  # head (2D -> 2 tags), 3 scalars s, gamma
    assert json.loads((tmp_path / "o" / "adapter_config.json").read_text())["labels"] == ["DT", "NN"]
    model, tok, info = load_finetuned(tmp_path / "o")
    assert isinstance(model, BiLMForTokenClassification) and model.mix is not None
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained == {"head.classifier.weight", "head.classifier.bias", "mix.scalars", "mix.gamma"}
    for name, value in model.encoder.state_dict().items():  # the biLM did not move
        assert torch.equal(value, bilm_before[name]), name
    assert not torch.equal(model.mix.scalars.detach(), torch.zeros(3))  # the mix did
    lines = ["the cat ran in the park", "a dog sat"]
    first = predict_lines(model, tok, info, lines)
    again, tok2, info2 = load_finetuned(tmp_path / "o")
    assert predict_lines(again, tok2, info2, lines) == first
    assert [len(r["labels"]) for r in first] == [6, 3] and first[0]["labels"][0] == "DT"


def test_full_seq_cls_and_the_strategies_that_do_not_apply(base, tmp_path):
    report = finetune(FinetuneArgs(model=str(base / "base"), task="seq-cls", train=str(base / "cls.csv"),
                                   eval=str(base / "cls.csv"), strategy="full", out=str(tmp_path / "full"),
                                   lr=1e-2, max_steps=30, batch_size=8, progress=False))
    assert report["trainable_params"] == report["full_finetune_params"] and report["eval"]["accuracy"] >= 0.75
    model, _, info = load_finetuned(tmp_path / "full")
    assert type(model).__name__ == "BiLMForSequenceClassification" and info["task"] == "seq-cls"
    for strategy in ("lora", "adapter"):
        with pytest.raises(LmforgeError, match="biLM"):
            finetune(FinetuneArgs(model=str(base / "base"), task="seq-cls", train=str(base / "cls.csv"),
                                  strategy=strategy, out=str(tmp_path / strategy), max_steps=1, progress=False))
