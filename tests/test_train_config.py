"""Recipes, overrides and the AdamW groups and schedule of lmforge.train."""

import doctest
import itertools
import math

import pytest
from torch import nn

import lmforge.train.config
import lmforge.train.metrics
import lmforge.train.optim
from lmforge.errors import LmforgeError
from lmforge.train import TrainConfig, apply_overrides, load_recipe, lr_at, param_groups, save_recipe


@pytest.mark.parametrize("module", [lmforge.train.config, lmforge.train.metrics, lmforge.train.optim])
def test_doctests(module):
    assert doctest.testmod(module).failed == 0


@pytest.fixture
def recipe_file(tmp_path):
    path = tmp_path / "gpt.yaml"
    path.write_text(
        "model: {preset: gpt-tiny, d_model: 64, dropout: 0.1, tie: true}\n"
        "data: {objective: clm, seq_len: 128}\n"
        "train: {lr: 6.0e-4, max_steps: 100, schedule: cosine}\n"
    )
    return path


def test_load_recipe_applies_typed_overrides(recipe_file, tmp_path):
    recipe = load_recipe(recipe_file, ["train.lr=1e-3", "train.betas=[0.9, 0.99]", "train.precision=bf16",
                                       "model.d_model=128", "model.dropout=0", "data.objective=mlm"])
    cfg = TrainConfig.from_dict(recipe["train"])
    assert cfg.lr == 1e-3 and cfg.betas == (0.9, 0.99) and cfg.precision == "bf16" and cfg.max_steps == 100
    assert recipe["model"]["d_model"] == 128 and recipe["model"]["dropout"] == 0
    assert recipe["data"]["objective"] == "mlm"
    save_recipe(recipe, tmp_path / "out" / "config.yaml")
    assert load_recipe(tmp_path / "out" / "config.yaml") == recipe


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("train.lrr=1", "train.lrr"),  # unknown train key
        ("train.max_steps=abc", "train.max_steps"),  # not an integer
        ("train.max_steps=1.5", "train.max_steps"),
        ("train.schedule=exponential", "train.schedule"),  # not one of the choices
        ("train.compile=maybe", "train.compile"),
        ("train.betas=[0.9]", "train.betas"),
        ("model.n_layerz=3", "model.n_layerz"),  # not in the recipe
        ("model.d_model=big", "model.d_model"),  # a number stays a number
        ("model.tie=3", "model.tie"),
        ("optim.lr=3", "optim.lr"),  # no such section
        ("train.lr", "train.lr"),  # no '='
    ],
)
def test_bad_override_names_the_key(recipe_file, override, key):
    with pytest.raises(LmforgeError, match=key.replace(".", r"\.")):
        load_recipe(recipe_file, [override])


def test_bad_recipe_values(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("train: {warmup: 10}\n")
    with pytest.raises(LmforgeError, match=r"train\.warmup: unknown key"):
        load_recipe(path)
    path.write_text("train: {lr: -1}\n")
    with pytest.raises(LmforgeError, match=r"train\.lr"):
        load_recipe(path)
    path.write_text("train: [1, 2\n")
    with pytest.raises(LmforgeError, match="invalid YAML"):
        load_recipe(path)
    with pytest.raises(LmforgeError, match="cannot read"):
        load_recipe(tmp_path / "missing.yaml")


def test_apply_overrides_leaves_the_input_alone():
    base = {"model": {"d": 1}}
    out = apply_overrides(base, ["model.d=2", "train.seed=3"])
    assert base == {"model": {"d": 1}} and out == {"model": {"d": 2}, "train": {"seed": 3}}


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
