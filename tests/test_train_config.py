"""The AdamW groups and the schedule of lmforge.train (recipes and overrides: tests/test_schema.py)."""

import doctest
import itertools
import math

import pytest
from torch import nn

import lmforge.train.config
import lmforge.train.metrics
import lmforge.train.optim
from lmforge.errors import LmforgeError
from lmforge.train import TrainConfig, lr_at, param_groups


@pytest.mark.parametrize("module", [lmforge.train.config, lmforge.train.metrics, lmforge.train.optim])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


def test_param_groups_decay_only_matrices():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 8)
            self.norm = nn.LayerNorm(8)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight  # tied

    model = Tiny()
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert [p is model.fc.weight for p in decay["params"]] == [True]
    ids = {id(p) for p in no_decay["params"]}
    assert ids == {id(model.emb.weight), id(model.fc.bias), id(model.norm.weight), id(model.norm.bias)}


def test_param_groups_of_the_decoder():
    decoder = pytest.importorskip("lmforge.models.decoder")
    from lmforge.models.config import get_preset

    model = decoder.Decoder(get_preset("gpt-tiny", n_layers=1))
    decay, no_decay = param_groups(model, 0.1)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert all(p.dim() == 2 for p in decay["params"])
    assert any(p is model.tok_emb.weight for p in no_decay["params"])


def test_schedules():
    cfg = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110, schedule="cosine")
    assert lr_at(1, cfg) == pytest.approx(0.1) and lr_at(10, cfg) == pytest.approx(1.0)
    assert lr_at(60, cfg) == pytest.approx(0.55)  # half-way: (lr + min_lr) / 2
    assert lr_at(110, cfg) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))  # decays monotonically
    lin = TrainConfig(lr=1.0, min_lr=0.0, warmup_steps=0, max_steps=100, schedule="linear")
    assert lr_at(50, lin) == pytest.approx(0.5) and lr_at(100, lin) == 0.0
    const = TrainConfig(lr=0.3, warmup_steps=5, max_steps=50, schedule="constant")
    assert lr_at(50, const) == 0.3 and math.isclose(lr_at(2, const), 0.12)


def test_config_rejects_bad_values():
    with pytest.raises(LmforgeError, match=r"train\.grad_accum"):
        TrainConfig(grad_accum=0)
    with pytest.raises(LmforgeError, match=r"train\.min_lr"):
        TrainConfig(lr=1e-3, min_lr=1e-2)
    assert TrainConfig.from_dict({"betas": [0.8, 0.9]}).betas == (0.8, 0.9)
