"""The training configuration and YAML recipes with ``key=value`` overrides.

A recipe is one YAML file with a section per concern; the trainer reads ``train:``, the caller builds
the model and the data from the others::

    model: {preset: gpt-tiny, d_model: 128}
    data:  {objective: clm, shards: runs/shards, seq_len: 128}
    train: {lr: 6.0e-4, max_steps: 2000, batch_size: 16, schedule: cosine}

``load_recipe("gpt.yaml", ["train.lr=1e-3", "model.d_model=256"])`` applies the overrides with type
checks (an unknown key or a value of the wrong type is an ``LmforgeError`` naming the key) and returns
the resolved recipe: a plain dict, saved beside the run as ``config.yaml``.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic

Schedule = Literal["cosine", "linear", "constant"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
Optimizer = Literal["adamw", "muon"]


@dataclass
class TrainConfig:
    """Everything the training loop needs; every field can be set from a recipe's ``train:`` section.

    Steps count optimizer updates, from 1 to ``max_steps``. One update sees
    ``batch_size * grad_accum * world_size`` rows: ``batch_size`` rows per micro-batch per process.
    """

    # optimizer: AdamW, decoupled weight decay on matrices only (not on norms, biases, embeddings);
    # or Muon for the Transformer layers' matrices with AdamW (lr, betas, eps) for the rest (docs/modern.md)
    optimizer: Optimizer = "adamw"
    muon_lr: float = 0.02  # Muon's peak learning rate; the schedule scales it like lr
    muon_momentum: float = 0.95
    lr: float = 3e-4
    min_lr: float = 0.0  # where cosine / linear decay ends, at max_steps
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global L2 norm of the gradients; 0 turns clipping off
    # schedule: linear warmup from 0 to lr over warmup_steps, then decay to min_lr
    warmup_steps: int = 0
    max_steps: int = 1000
    schedule: Schedule = "cosine"
    # batches
    batch_size: int = 8  # rows per micro-batch, per process
    grad_accum: int = 1  # micro-batches per update
    # evaluation, checkpoints, logs (0 turns a periodic event off; the last step always saves)
    eval_every: int = 0
    eval_batches: int = 0  # how many validation batches per evaluation; 0 = all of them
    save_every: int = 100
    keep_last: int = 3  # checkpoints kept on disk (0 = keep all)
    log_every: int = 10
    progress: bool = True  # tqdm bar on standard error
    tensorboard: bool = False  # TensorBoard event files (needs the tensorboard package: lmforge[tensorboard])
    plot: bool = True  # run_dir/loss.png at each evaluation and at the end
    # execution
    precision: Precision = "auto"  # auto = bf16 autocast on CUDA (where the GPU has bf16), else fp32
    compile: bool | Literal["auto"] = "auto"  # auto = torch.compile on CUDA (not under FSDP), else eager
    seed: int = 0
    device: str = "auto"  # auto = cuda:LOCAL_RANK when CUDA is available, else cpu
    ddp: bool = True  # wrap in DistributedDataParallel when launched by torchrun with WORLD_SIZE > 1
    fsdp: bool = False  # shard parameters, gradients and optimizer state instead (large models)
    dist_timeout: float = 600.0  # seconds a process waits for the others in a collective before failing

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # type: ignore[assignment]  (YAML gives a list)
        checks = [  # (field, holds, why: what a valid value is)
            ("lr", self.lr > 0, "must be > 0"),
            ("min_lr", 0 <= self.min_lr <= self.lr, f"must be between 0 and lr ({self.lr})"),
            ("max_steps", self.max_steps >= 1, "must be >= 1"),
            ("warmup_steps", 0 <= self.warmup_steps < self.max_steps or self.warmup_steps == 0,
             f"must be >= 0 and smaller than max_steps ({self.max_steps})"),
            ("batch_size", self.batch_size >= 1, "must be >= 1"),
            ("grad_accum", self.grad_accum >= 1, "must be >= 1"),
            ("grad_clip", self.grad_clip >= 0, "must be >= 0 (0 turns clipping off)"),
            ("betas", len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas),
             "must be two numbers in [0, 1)"),
            ("eps", self.eps > 0, "must be > 0"),
            ("weight_decay", self.weight_decay >= 0, "must be >= 0"),
            ("dist_timeout", self.dist_timeout > 0, "must be > 0 seconds"),
            ("muon_lr", self.muon_lr > 0, "must be > 0"),
            ("muon_momentum", 0 <= self.muon_momentum < 1, "must be in [0, 1)"),
        ]
        for name in ("eval_every", "eval_batches", "save_every", "keep_last", "log_every"):
            checks.append((name, getattr(self, name) >= 0, "must be >= 0 (0 turns it off)"))
        for name, ok, why in checks:
            if not ok:
                raise LmforgeError(f"train.{name}: invalid value {getattr(self, name)!r}: {why}")

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None, section: str = "train") -> TrainConfig:
        """Build from a recipe section, checking every key and type (errors name ``train.key``)."""
        values = dict(values or {})
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in hints:
                raise LmforgeError(f"{section}.{key}: unknown key; known keys are {', '.join(names)}")
            values[key] = coerce(values[key], hints[key], f"{section}.{key}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d


def coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against a type hint (int, float, bool, str, Literal, tuple, Optional); return it.

    >>> coerce(1, float, "train.lr")      # an int where a float is expected is fine
    1.0
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except LmforgeError as err:
                errors.append(str(err))
        raise LmforgeError(errors[0] if errors else f"{key}: expected a value, got {value!r}")
    if origin is Literal:
        if value not in args:
            raise LmforgeError(f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise LmforgeError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True)))
    if hint is bool:
        if not isinstance(value, bool):
            raise LmforgeError(f"{key}: expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LmforgeError(f"{key}: expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise LmforgeError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise LmforgeError(f"{key}: expected a string, got {value!r}")
        return value
    return value  # types we do not check (dicts, lists of anything)


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"train.lr=1e-3"`` -> (["train", "lr"], 0.001). The value is parsed as YAML (1e-3 is a float)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise LmforgeError(f"override {item!r}: expected key=value, e.g. train.lr=1e-3")
    path = key.strip().split(".")
    if any(not part for part in path):
        raise LmforgeError(f"override {item!r}: empty part in key {key!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as err:
        raise LmforgeError(f"{key}: cannot parse value {text!r}: {err}") from None
    if isinstance(value, str) and _is_number(value):
        value = float(value)  # YAML 1.1 reads "1e-3" (no dot) as a string; it is meant as a number
    return path, value


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def apply_overrides(
    recipe: dict[str, Any], overrides: list[str], schemas: dict[str, type] | None = None
) -> dict[str, Any]:
    """Return a copy of ``recipe`` with ``a.b=c`` overrides applied and type-checked.

    A section with a schema dataclass (``train`` -> TrainConfig by default) accepts its fields and checks
    their types from the dataclass (the schema ``dict`` accepts any key); elsewhere an override must name a
    key that the recipe already has, and a number, boolean or string must stay a number, boolean or string.
    """
    schemas = {"train": TrainConfig} if schemas is None else schemas
    out = _deep_copy(recipe)
    for item in overrides:
        path, value = parse_override(item)
        key = ".".join(path)
        schema = schemas.get(path[0])
        if schema is dict and len(path) == 2:  # a free-form section: any key, its value as YAML reads it
            pass
        elif schema is not None and len(path) == 2:
            hints = typing.get_type_hints(schema)
            if path[1] not in hints:
                raise LmforgeError(f"{key}: unknown key; known keys are {', '.join(hints)}")
            value = coerce(value, hints[path[1]], key)
        else:
            node: Any = out
            for part in path[:-1]:
                if not isinstance(node, dict) or part not in node:
                    raise LmforgeError(f"{key}: unknown key (no section {part!r} in the recipe)")
                node = node[part]
            if not isinstance(node, dict) or path[-1] not in node:
                raise LmforgeError(f"{key}: unknown key (not in the recipe)")
            value = _same_kind(node[path[-1]], value, key)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return out


def _same_kind(old: Any, new: Any, key: str) -> Any:
    """A recipe value keeps its kind: a boolean stays a boolean, a number a number, a string a string."""
    if old is None or new is None:
        return new
    if isinstance(old, bool):
        return coerce(new, bool, key)
    if isinstance(old, int | float):
        return new if isinstance(new, int) and not isinstance(new, bool) else coerce(new, float, key)
    if isinstance(old, str):
        is_number = isinstance(new, int | float) and not isinstance(new, bool)
        return str(new) if is_number else coerce(new, str, key)
    if isinstance(old, list | dict) and not isinstance(new, type(old)):
        raise LmforgeError(f"{key}: expected a {type(old).__name__}, got {new!r}")
    return new


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value


RECIPES = Path(__file__).resolve().parents[1] / "recipes"  # the recipes that ship with lmforge (configs/)


def find_recipe(name: str | Path) -> Path:
    """A recipe file: ``name`` itself when it exists, else the packaged recipe of that name
    (``--config gpt-mini`` works from any directory; ``configs/gpt-mini.yaml`` in a checkout is the same file).

    >>> find_recipe("gpt-mini").name
    'gpt-mini.yaml'
    """
    path = Path(name)
    if path.exists() or len(path.parts) > 1:
        return path
    packaged = RECIPES / (path.name if path.suffix in (".yaml", ".yml") else f"{path.name}.yaml")
    if packaged.is_file():
        return packaged
    known = ", ".join(sorted(p.stem for p in RECIPES.glob("*.yaml")))
    raise LmforgeError(f"{name}: no such recipe file, and no recipe of that name ships with lmforge ({known})")


def load_recipe(
    path: str | Path, overrides: list[str] | None = None, schemas: dict[str, type] | None = None
) -> dict[str, Any]:
    """Read a YAML recipe, apply ``key=value`` overrides, and validate the ``train:`` section.

    Returns the resolved recipe (a dict of sections); ``TrainConfig.from_dict(recipe["train"])``
    gives the trainer's config.
    """
    path = find_recipe(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise LmforgeError(f"{path}: cannot read recipe: {err.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise LmforgeError(f"{path}: not a YAML recipe: invalid UTF-8 at byte offset {err.start}") from None
    try:
        recipe = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise LmforgeError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(recipe, dict):
        raise LmforgeError(f"{path}: a recipe is a mapping of sections (model:, data:, train:)")
    recipe = apply_overrides(recipe, overrides or [], schemas)
    train = TrainConfig.from_dict(recipe.get("train"))
    recipe["train"] = train.to_dict()
    return recipe


def save_recipe(recipe: dict[str, Any], path: str | Path) -> None:
    """Write the resolved recipe as YAML, atomically (temp file in the same directory, then rename)."""
    write_text_atomic(Path(path), yaml.safe_dump(recipe, sort_keys=False))


def diff_recipes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two recipes: ``["model.d_model", "train.lr"]``."""
    keys = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        name = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += diff_recipes(a, b, name + ".")
        elif _normal(a) != _normal(b):
            keys.append(name)
    return keys


def _normal(v: Any) -> Any:
    return list(v) if isinstance(v, tuple) else v


# Sections a resumed run must share with the run it resumes (its corpus, tokenizer, model, task), and the
# keys inside them that only change how long it trains, how often it evaluates or how fast it reads.
FIXED_SECTIONS = ("model", "tokenizer", "data", "finetune")
MAY_CHANGE = frozenset({"data.workers", "data.eval_batches", "data.eval_batch_size", "finetune.epochs",
                        "finetune.max_steps", "finetune.save_every", "finetune.eval", "finetune.eval_batch_size",
                        "finetune.device", "finetune.keep_checkpoints", "finetune.overwrite", "finetune.lr",
                        "finetune.warmup", "finetune.weight_decay"})


def resume_changes(saved_path: str | Path, recipe: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """Keys whose values differ from the run's saved ``config.yaml`` ([] when there is none).

    A changed key of a fixed section (``data.files``, ``tokenizer.vocab_size``, ``model.d_model``) is an
    LmforgeError naming it: resuming would train the saved weights on other data, or the record would lie.
    Keys starting with one of ``ignore`` are not compared.
    """
    path = Path(saved_path)
    if not path.is_file():
        return []
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise LmforgeError(f"{path}: unreadable run record ({str(err).splitlines()[0]})") from None
    changed = [k for k in diff_recipes(saved, recipe) if not k.startswith(ignore)]
    fatal = [k for k in changed if k.split(".")[0] in FIXED_SECTIONS and k not in MAY_CHANGE]
    if fatal:
        key = fatal[0]
        raise LmforgeError(f"{path}: {key} is {_lookup(saved, key)!r} in this run but {_lookup(recipe, key)!r} now; "
                           "the directory holds a run of other settings: rerun with its settings or choose a new "
                           "--out")
    return changed


def _lookup(recipe: dict[str, Any], key: str) -> Any:
    node: Any = recipe
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def default_recipe(model: Any, config: TrainConfig) -> dict[str, Any]:
    """``{"model": <model.config as a dict, if any>, "train": config}``: what config.yaml holds by default."""
    recipe: dict[str, Any] = {}
    model_config = getattr(model, "config", None)
    if is_dataclass(model_config) and not isinstance(model_config, type):
        recipe["model"] = {"class": type(model).__name__, **_plain(model_config)}
    recipe["train"] = config.to_dict()
    return recipe


def _plain(obj: Any) -> Any:
    """A dataclass as YAML-safe builtins (tuples as lists)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in vars(obj).items() if not k.startswith("_")}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    return obj


__all__ = [
    "Optimizer",
    "Precision",
    "Schedule",
    "TrainConfig",
    "apply_overrides",
    "coerce",
    "default_recipe",
    "diff_recipes",
    "load_recipe",
    "parse_override",
    "resume_changes",
    "save_recipe",
]
