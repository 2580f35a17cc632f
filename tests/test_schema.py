"""One schema for every setting (lmforge.schema): recipes, KEY=VALUE and flags derived from the same fields."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from lmforge.cli import build_parser, main
from lmforge.errors import LmforgeError
from lmforge.schema import RECIPES, Recipe, Text, build, load_recipe, plain, setting
from lmforge.train.config import TrainConfig
from lmforge.workflows.finetune_args import FINETUNE, FinetuneArgs
from lmforge.workflows.pretrain_args import PRETRAIN

PACKAGED = sorted(RECIPES.glob("*.yaml"))
# The flags that are not settings: paths, texts to work on, output switches (the "paths, --config, --quiet").
NOT_SETTINGS = {"help", "config", "print_config", "quiet", "overrides", "model", "out", "prompt", "json", "text",
                "ids", "files", "tokenizer", "data", "png", "eval", "align", "target", "query", "similar", "analogy",
                "overwrite", "from_hf", "to_hf", "to_peft", "merge", "chat", "from_gguf", "to_gguf", "quantize",
                "tasks", "fewshot"}  # paths and texts: the rest are settings


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()):
    """(name, parser) of every leaf command."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield " ".join(prefix), parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from commands(sub, (*prefix, name))


# -- the recipes ----------------------------------------------------------------------------------------------
def test_the_modern_switches_are_settable_from_the_command_line():
    code, out, err = run(["pretrain", "--config", "gpt-mini", "model.norm=rmsnorm", "model.positions=rotary",
                          "--max-steps", "700", "--print-config"])
    assert code == 0, err
    recipe = yaml.safe_load(out)
    assert recipe["model"]["norm"] == "rmsnorm" and recipe["model"]["positions"] == "rotary"
    assert recipe["train"]["max_steps"] == 700 and recipe["model"]["d_model"] == 128  # the recipe's own value kept


@pytest.mark.parametrize("path", PACKAGED, ids=lambda p: p.stem)
def test_every_key_of_every_packaged_recipe_is_settable_as_key_value(path):
    """Each resolved key, written back as KEY=VALUE text, parses to the same value (and differs from nothing)."""
    schema = FINETUNE if "finetune" in yaml.safe_load(path.read_text()) else PRETRAIN
    required = {"bert-dapt": ["data.files=[my.txt]", "model.init_from=base"],  # the recipes leave these to the user
                "finetune-lora": ["finetune.model=base", "finetune.train=train.csv"]}.get(path.stem, [])
    resolved = plain(load_recipe(schema, path, required))
    overrides = [f"{section}.{key}={_as_text(value)}" for section, values in resolved.items()
                 for key, value in values.items() if not (section == "model" and key == "init_from")]
    assert plain(load_recipe(schema, path, [*required, *overrides])) == resolved


def _as_text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value).lower() if isinstance(value, bool) else str(value)


def test_a_key_value_override_changes_exactly_its_key():
    base = plain(load_recipe(PRETRAIN, "gpt-mini"))
    for item, key, value in [("train.lr=1e-3", ("train", "lr"), 1e-3), ("train.betas=[0.9, 0.99]",
                             ("train", "betas"), [0.9, 0.99]), ("model.qk_norm=true", ("model", "qk_norm"), True),
                             ("data.files=[a.txt, b.txt]", ("data", "files"), ["a.txt", "b.txt"]),
                             ("tokenizer.pattern=gpt4", ("tokenizer", "pattern"), "gpt4"),
                             ("model.logit_softcap=15", ("model", "logit_softcap"), 15.0)]:
        changed = plain(load_recipe(PRETRAIN, "gpt-mini", [item]))
        assert changed[key[0]][key[1]] == value, item
        if key[1] in base[key[0]]:
            changed[key[0]][key[1]] = base[key[0]][key[1]]
        else:  # a key the recipe does not name (the preset's value applied until now)
            del changed[key[0]][key[1]]
        assert changed == base, item


@pytest.mark.parametrize(("override", "message"), [
    ("train.lrr=1", r"train\.lrr: unknown key; did you mean train\.lr\?"),
    ("train.max_steps=abc", r"train\.max_steps: expected an integer, got 'abc'"),
    ("train.max_steps=0", r"train\.max_steps: must be >= 1, got 0"),
    ("train.schedule=exponential", r"train\.schedule: expected one of cosine, linear, constant"),
    ("train.betas=[0.9]", r"train\.betas: expected a list of 2 values"),
    ("train.muon_momentum=1", r"train\.muon_momentum: must be < 1"),
    ("model.n_layerz=3", r"model\.n_layerz: unknown key; did you mean model\.n_layers\?"),
    ("model.d_model=big", r"model\.d_model: expected an integer"),
    ("model.norm=batchnorm", r"model\.norm: expected one of layernorm, rmsnorm"),
    ("model.dropout=1.5", r"model\.dropout: must be < 1"),
    ("model.preset=gpt5", r"model\.preset: unknown preset"),
    ("data.objective=mlx", r"data\.objective: expected one of clm, mlm"),
    ("optim.lr=3", r"optim: unknown section"),
    ("train.lr", r"train\.lr: expected SECTION\.KEY=VALUE"),
])
def test_a_bad_override_is_one_line_naming_the_key(override, message):
    with pytest.raises(LmforgeError, match=message):
        load_recipe(PRETRAIN, "gpt-mini", [override])


def test_a_misspelt_section_is_refused_with_the_closest_name(tmp_path):
    for typo, right in [("trian", "train"), ("tokeniser", "tokenizer"), ("modle", "model")]:
        path = tmp_path / f"{typo}.yaml"
        path.write_text(f"data: {{files: [x.txt]}}\n{typo}: {{max_steps: 4}}\n")
        with pytest.raises(LmforgeError, match=rf"^{typo}: unknown section; did you mean {right}\?"):
            load_recipe(PRETRAIN, path)
    path = tmp_path / "f.yaml"
    path.write_text("fintune: {task: seq-cls}\n")
    with pytest.raises(LmforgeError, match=r"fintune: unknown section; did you mean finetune\?"):
        load_recipe(FINETUNE, path)
    code, _, err = run(["pretrain", "--config", str(tmp_path / "trian.yaml"), "--print-config"])
    assert code == 2 and err.count("\n") == 1 and "did you mean train?" in err


def test_the_model_section_follows_the_preset_class():
    encoder = plain(load_recipe(PRETRAIN, None, ["data.objective=mlm", "data.files=[x]", "model.type_vocab_size=3"]))
    assert encoder["model"]["preset"] == "bert-tiny" and encoder["model"]["type_vocab_size"] == 3
    with pytest.raises(LmforgeError, match=r"model\.type_vocab_size: unknown key"):  # a decoder has no segments
        load_recipe(PRETRAIN, None, ["data.files=[x]", "model.type_vocab_size=3"])
    with pytest.raises(LmforgeError, match=r"model\.vocab_size: set by the preset and the tokenizer"):
        load_recipe(PRETRAIN, None, ["data.files=[x]", "model.vocab_size=3"])


def test_sections_checked_in_python_too():
    with pytest.raises(LmforgeError, match=r"train\.lr: must be > 0"):
        TrainConfig(lr=0)
    with pytest.raises(LmforgeError, match=r"train\.warmup_steps: must be smaller than max_steps"):
        TrainConfig(warmup_steps=10, max_steps=10)
    with pytest.raises(LmforgeError, match=r"finetune\.lora_r: must be >= 1"):
        FinetuneArgs(model="m", task="seq-cls", train="t", lora_r=0).check()


def test_muon_has_its_own_weight_decay_off_by_default():
    config = TrainConfig()
    assert config.muon_weight_decay == 0.0 and config.weight_decay == 0.1


# -- the flags: derived, never hand-written ------------------------------------------------------------------
def test_every_flag_is_a_setting_or_a_path():
    """No command adds a flag by hand for a setting: each option's dest is SECTION.KEY, or a path / text."""
    hand_written = []
    for name, parser in commands(build_parser()):
        for action in parser._actions:
            if "." not in action.dest and action.dest not in NOT_SETTINGS:
                hand_written.append(f"{name}: {action.dest}")
    assert hand_written == []


def test_every_flag_is_a_field_with_its_default_and_help():
    for name, parser in commands(build_parser()):
        schema = parser.get_default("schema")
        for action in parser._actions:
            if "." not in action.dest:
                continue
            section, key = action.dest.split(".")
            cls = schema.recipe.sections[section]
            field = {f.name: f for f in dataclasses.fields(cls)}[key]
            assert action.help and field.metadata["help"].replace("%", "%%") in action.help, (name, action.dest)
            assert action.default is argparse.SUPPRESS  # "not given": the recipe or the field's default decides


EVERY_COMMAND = [["pretrain", "--config", "gpt-mini"], ["finetune", "--model", "m", "--task", "seq-cls", "--train",
                  "t.csv"], ["generate", "--model", "m"], ["translate", "--model", "m"], ["embed", "--model", "m"],
                 ["attention", "--model", "m", "--out", "a.png"], ["evaluate", "--model", "m", "--data", "d"],
                 ["predict", "--model", "m"], ["tokenizer", "train", "--out", "o", "f"],
                 ["tokenizer", "encode", "--tokenizer", "t"],
                 ["data", "prepare", "--tokenizer", "t", "--out", "o", "f"],
                 ["demo"], ["convert", "--to-hf", "m", "--out", "o"]]


@pytest.mark.parametrize("argv", EVERY_COMMAND, ids=lambda a: " ".join(a[:2]))
def test_print_config_round_trips_through_config(argv, tmp_path):
    code, out, err = run([*argv, "--print-config"])
    assert code == 0, err
    saved = tmp_path / "settings.yaml"
    saved.write_text(out)
    code, again, err = run([*argv, "--config", str(saved), "--print-config"])
    assert code == 0 and again == out, err


def test_precedence_defaults_then_config_then_key_value_then_flags(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("data: {files: [x.txt]}\ntrain: {lr: 0.002, max_steps: 50, batch_size: 4}\n")
    code, out, _ = run(["pretrain", "--config", str(path), "train.max_steps=60", "train.batch_size=5",
                          "--batch-size", "6", "--print-config"])
    train = yaml.safe_load(out)["train"]
    assert code == 0 and (train["lr"], train["max_steps"], train["batch_size"], train["seed"]) == (0.002, 60, 6, 0)


def test_a_command_default_is_the_commands_own():
    _, out, _ = run(["translate", "--model", "m", "--print-config"])
    assert yaml.safe_load(out)["decode"]["beams"] == 4
    _, out, _ = run(["generate", "--model", "m", "--print-config"])
    assert yaml.safe_load(out)["generate"]["beams"] == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "--model", "m", "--top-k", "0"], "argument --top-k: must be >= 1, got 0"),
    (["generate", "--model", "m", "--top-p", "1.5"], "argument --top-p: must be <= 1, got 1.5"),
    (["generate", "--model", "m", "--temperature", "x"], "argument --temperature: expected a number, got 'x'"),
    (["generate", "--model", "m", "--seed", str(2**64)],  # a torch.Generator takes no more: refused, not crashed
     f"argument --seed: must be <= {2**64 - 1}, got {2**64}"),
    (["generate", "--model", "m", "--stop", ""], "generate.stop[0]: must not be empty"),
    (["generate", "--model", "m", "--beams", "2", "--top-k", "5"], "generate.beams: beam search is deterministic"),
    (["pretrain", "--config", "gpt-mini", "--lr", "-1"], "argument --lr: must be > 0, got -1.0"),
    (["pretrain", "--config", "gpt-mini", "--precision", "fp8"],
     "argument --precision: expected one of auto, fp32, bf16, fp16, got 'fp8'"),
    (["finetune", "--strategy", "qlora"],
     "argument --strategy: expected one of full, frozen, lora, adapter, got 'qlora'"),
    (["embed", "--model", "m", "--pooling", "max"], "argument --pooling: expected one of mean, cls, last, got 'max'"),
])
def test_a_bad_flag_is_one_line_naming_the_flag(argv, message):
    code, _, err = run(argv)
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_flags_and_key_value_give_the_same_settings():
    _, by_flag, _ = run(["finetune", "--model", "m", "--task", "seq-cls", "--train", "t", "--lora-r", "4",
                         "--lora-targets", "*.in_proj", "--lora-targets", "*.fc1", "--no-progress", "--print-config"])
    _, by_key, _ = run(["finetune", "finetune.model=m", "finetune.task=seq-cls", "finetune.train=t",
                        "finetune.lora_r=4", "finetune.lora_targets=[*.in_proj, *.fc1]", "finetune.progress=false",
                        "--print-config"])
    assert by_flag == by_key and yaml.safe_load(by_flag)["finetune"]["lora_targets"] == ["*.in_proj", "*.fc1"]


def test_a_recipe_section_a_command_does_not_read_is_refused(tmp_path):
    path = tmp_path / "ft.yaml"
    path.write_text("finetune: {task: seq-cls}\ntrain: {lr: 0.1}\n")  # finetune never read a train: section
    code, _, err = run(["finetune", "--config", str(path), "--model", "m", "--train", "t", "--print-config"])
    assert code == 2 and "train: unknown section" in err


# -- the resume policy lives with the workflow's sections --------------------------------------------------
def test_resume_keeps_fixed_sections_and_lets_may_change_keys_change(tmp_path):
    recipe = load_recipe(PRETRAIN, "gpt-mini")
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(plain(recipe)))
    changed = PRETRAIN.resume_changes(saved, load_recipe(PRETRAIN, "gpt-mini", ["train.max_steps=5000",
                                                                               "data.workers=2", "train.lr=1e-2"]))
    assert changed == ["data.workers", "train.lr", "train.max_steps"]
    with pytest.raises(LmforgeError, match=r"model\.d_model is 128 in this run but 256 now"):
        PRETRAIN.resume_changes(saved, load_recipe(PRETRAIN, "gpt-mini", ["model.d_model=256"]))
    with pytest.raises(LmforgeError, match=r"data\.seq_len"):
        PRETRAIN.resume_changes(saved, load_recipe(PRETRAIN, "gpt-mini", ["data.seq_len=64"]))
    assert "data.workers" in PRETRAIN.may_change() and "data.seq_len" not in PRETRAIN.may_change()


def test_the_engine_holds_no_workflow_keys():
    source = (Path(__file__).resolve().parents[1] / "src/lmforge/train").rglob("*.py")
    assert not [p.name for p in source if "finetune." in p.read_text() or "\"data." in p.read_text()]


# -- the schema itself -----------------------------------------------------------------------------------------
@dataclasses.dataclass
class Toy:
    n: int = setting(3, "a count", min=1)
    rate: float = setting(0.5, "a share", min=0, below=1)
    mode: typing.Literal["a", "b"] = setting("a", "a or b")
    names: list[str] = setting(factory=list, help="names")
    cap: float | None = setting(None, "a cap", above=0)


def test_text_is_parsed_by_the_field_type_and_python_values_are_checked():
    toy = build(Toy, {"n": Text("4"), "rate": Text("0.25"), "mode": Text("b"), "names": Text("[x, 'y z']"),
                      "cap": Text("null")}, "toy")
    assert toy == Toy(n=4, rate=0.25, mode="b", names=["x", "y z"], cap=None)
    assert build(Toy, {"cap": 2}, "toy").cap == 2.0 and isinstance(build(Toy, {"cap": 2}, "toy").cap, float)
    for values, message in [({"n": True}, "toy.n: expected an integer"), ({"n": 1.0}, "toy.n: expected an integer"),
                            ({"rate": 1}, "toy.rate: must be < 1"), ({"mode": "c"}, "toy.mode: expected one of a, b"),
                            ({"names": "x"}, "toy.names: expected a list"), ({"cap": 0}, "toy.cap: must be > 0"),
                            ({"rate": float("nan")}, "toy.rate: expected a number")]:
        with pytest.raises(LmforgeError, match=message):
            build(Toy, values, "toy")


def test_recipe_resolves_sections_in_order_with_defaults():
    recipe = Recipe({"toy": Toy, "train": TrainConfig})
    resolved = recipe.resolve({"toy": {"n": 2}})
    assert resolved["toy"] == Toy(n=2) and resolved["train"] == TrainConfig()


def test_version_imports_no_yaml_torch_or_numpy():
    code = "import sys; from lmforge.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\n" \
           "print(sorted(m for m in ('yaml', 'torch', 'numpy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip().endswith("[]"), result.stdout + result.stderr
