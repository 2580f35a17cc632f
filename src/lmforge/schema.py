"""Settings declared once: a dataclass field gives the YAML key, the KEY=VALUE override, the flag and the check.

A *section* is a dataclass whose fields are declared with ``setting``: type (the annotation), default, range
and a one-line help. Everything else is derived from it::

    @dataclass
    class Sampling:
        temperature: float = setting(0.0, "0 = greedy; > 0 samples from softmax(logits / T)", min=0)
        top_k: int | None = setting(None, "sample among the K most likely tokens only", min=1)

    YAML recipe            sampling: {temperature: 0.8}
    KEY=VALUE override     sampling.temperature=0.8
    command-line flag      --temperature 0.8             (lmforge.cli.common.add_settings)
    check                  one checker for all three: type, range, choices; errors name the key in one line
    --print-config         the resolved sections as YAML

Values typed by a person (KEY=VALUE, flags) arrive as ``Text`` and are parsed by their field's type, never
guessed: ``model.norm=rmsnorm`` is a string because ``norm`` is a ``str`` field, ``train.lr=1e-3`` a float.

This module is standard library only (YAML is imported when a recipe file is read): the command line
builds its flags from the sections at start-up without importing torch.

    >>> @dataclass
    ... class Demo:
    ...     lr: float = setting(3e-4, "peak learning rate", above=0)
    ...     steps: int = setting(100, "optimizer steps", min=1)
    >>> build(Demo, {"lr": Text("1e-3")}, "train")
    Demo(lr=0.001, steps=100)
    >>> build(Demo, {"step": 5}, "train")
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: train.step: unknown key; did you mean train.steps? (valid: lr, steps)
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass
from numbers import Real
from pathlib import Path
from typing import Any, Literal

from lmforge.errors import LmforgeError

__all__ = ["Recipe", "Text", "api_rules", "build", "check_range", "check_section", "closest", "default_values",
           "describe", "diff_recipes", "find_recipe", "load_recipe", "plain", "setting", "split_override"]


class Text(str):
    """A value a person typed (KEY=VALUE, a flag): parsed by its field's type (``Text("3")`` -> 3 for an int)."""


def setting(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            min: float | None = None, max: float | None = None, above: float | None = None,
            below: float | None = None, choices: Iterable[Any] | None = None, nonempty: bool = False,
            max_items: int | None = None, max_chars: int | None = None, api: typing.Mapping[str, Any] | None = None,
            flag: bool = True, short: str | None = None, metavar: str | None = None, may_change: bool = False) -> Any:
    """A dataclass field with what the schema needs: help, range (min <= v <= max, above < v < below), choices.

    A list's items are each checked by the range; ``nonempty`` refuses an empty string (or an empty string in a
    list), ``max_items`` a longer list, ``max_chars`` a longer string. ``api`` holds the rules of the HTTP API
    (OpenAI's) where they differ from the rest, e.g. ``api={"max": 2}`` for a temperature: the server's request
    models read the field's rules through ``api_rules``, everything else reads the field's own.
    ``flag=False`` keeps a field out of the command line (KEY=VALUE and YAML still set it); ``may_change``
    marks a key that a resumed run may change (how long, how often: not what is trained on).
    """
    meta = {"help": help, "min": min, "max": max, "above": above, "below": below,
            "choices": tuple(choices) if choices is not None else None, "nonempty": nonempty,
            "max_items": max_items, "max_chars": max_chars, "api": dict(api or {}), "flag": flag, "short": short,
            "metavar": metavar, "may_change": may_change}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


# -- one checker ------------------------------------------------------------------------------------------
def hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def closest(name: str, names: Iterable[str]) -> list[str]:
    """The valid names nearest to a misspelt one: ``closest("trian", ["train", "data"])`` -> ["train"]."""
    import difflib

    return difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)


def unknown(key: str, name: str, names: Iterable[str], what: str) -> LmforgeError:
    """One line for an unknown key or section: the nearest valid names, then all of them."""
    names = sorted(names)
    near = closest(name, names)
    prefix = key[: len(key) - len(name)]
    hint = f"; did you mean {' or '.join(prefix + n for n in near)}?" if near else ""
    return LmforgeError(f"{key}: unknown {what}{hint} (valid: {', '.join(names)})")


def parse(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against a type hint; ``Text`` parsed by it. Returns the typed value.

    >>> parse(Text("0.9,0.95"), tuple[float, float], "train.betas")
    (0.9, 0.95)
    >>> parse(Text("null"), int | None, "data.workers") is None
    True
    """
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and (value is None or (isinstance(value, Text) and value.lower() in NULL)):
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return parse(value, arg, key)
            except LmforgeError as err:
                errors.append(str(err))
        raise LmforgeError(errors[0])
    if origin is Literal:
        allowed = {str(a): a for a in args}
        if isinstance(value, Text) and value in allowed:
            return allowed[value]
        if value not in args or isinstance(value, bool) != any(isinstance(a, bool) for a in args if a == value):
            raise LmforgeError(f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin in (list, tuple):
        items = split_list(value) if isinstance(value, Text) else value
        if not isinstance(items, list | tuple):
            raise LmforgeError(f"{key}: expected a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(items) != len(args):
                raise LmforgeError(f"{key}: expected a list of {len(args)} values, got {value!r}")
            return tuple(parse(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(items, args, strict=True)))
        item = args[0] if args else Any
        return origin(parse(v, item, f"{key}[{i}]") for i, v in enumerate(items))
    if isinstance(value, Text):
        return parse_text(value, hint, key)
    if hint is bool and not isinstance(value, bool):
        raise LmforgeError(f"{key}: expected true or false, got {value!r}")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise LmforgeError(f"{key}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise LmforgeError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise LmforgeError(f"{key}: expected a string, got {value!r}")
    return value


NULL = ("null", "none", "~")
TRUE, FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def parse_text(text: str, hint: Any, key: str) -> Any:
    """A typed string by its field's type: int, float, bool (true/false/yes/no/on/off/1/0), str, or YAML."""
    if hint is str:
        return str(text)
    if hint is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise LmforgeError(f"{key}: expected true or false, got {text!r}")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise LmforgeError(f"{key}: expected an integer, got {text!r}") from None
    if hint is float:
        try:
            number = float(text)
        except ValueError:
            raise LmforgeError(f"{key}: expected a number, got {text!r}") from None
        if not math.isfinite(number):
            raise LmforgeError(f"{key}: expected a finite number, got {text!r}")
        return number
    import yaml  # dicts and free-form values: as YAML reads them

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise LmforgeError(f"{key}: cannot parse {text!r}: {str(err).splitlines()[0]}") from None


def split_list(text: str) -> list[Text]:
    """``"[a, b]"``, ``"a,b"`` or ``"[]"`` -> the items as Text (quotes around an item removed)."""
    body = text.strip()
    if body.startswith("[") and body.endswith("]"):
        body = body[1:-1]
    items = [item.strip() for item in body.split(",")] if body.strip() else []
    return [Text(item[1:-1] if len(item) > 1 and item[0] == item[-1] and item[0] in "'\"" else item) for item in items]


BOUNDS = (("min", ">=", lambda v, b: v >= b), ("max", "<=", lambda v, b: v <= b),
          ("above", ">", lambda v, b: v > b), ("below", "<", lambda v, b: v < b))


def check_range(value: Any, meta: typing.Mapping[str, Any], key: str) -> None:
    """The field's choices, bounds and lengths (None passes: it means "off" or "default"); a list's items are
    each checked by the bounds (``key[i]``). NaN is outside every bound.

    >>> check_range([" ", ""], {"nonempty": True}, "stop")
    Traceback (most recent call last):
    ...
    lmforge.errors.LmforgeError: stop[1]: must not be empty
    """
    if value is None:
        return
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise LmforgeError(f"{key}: expected one of {', '.join(map(str, choices))}, got {value!r}")
    if isinstance(value, list | tuple):
        most = meta.get("max_items")
        if most is not None and len(value) > most:
            raise LmforgeError(f"{key}: must have at most {most} items, got {len(value)}")
        for i, item in enumerate(value):
            check_range(item, {**meta, "choices": None}, f"{key}[{i}]")
        return
    if isinstance(value, str):
        if meta.get("nonempty") and not value:
            raise LmforgeError(f"{key}: must not be empty")
        longest = meta.get("max_chars")
        if longest is not None and len(value) > longest:
            raise LmforgeError(f"{key}: must be at most {longest} characters, got {len(value):,}")
        return
    if isinstance(value, bool) or not isinstance(value, Real):  # a NumPy number is one too
        return
    for name, sign, holds in BOUNDS:
        bound = meta.get(name)
        if bound is not None and not holds(value, bound):
            raise LmforgeError(f"{key}: must be {sign} {bound}, got {value!r}")


def api_rules(f: dataclasses.Field) -> dict[str, Any]:
    """A field's rules as the HTTP API applies them: its own, replaced by those its ``api`` declares.

    >>> @dataclass
    ... class Demo:
    ...     temperature: float = setting(0.0, "softmax temperature", min=0, api={"max": 2})
    >>> rules = api_rules(dataclasses.fields(Demo)[0]); rules["min"], rules["max"]
    (0, 2)
    """
    return {**f.metadata, **(f.metadata.get("api") or {})}


def check_section(cls: type, values: typing.Mapping[str, Any], section: str) -> dict[str, Any]:
    """Each value of a section checked against its field (type, range, choices): the typed values.

    An unknown key is one line naming the closest valid keys.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}
    types_ = hints(cls)
    out = {}
    for name, value in values.items():
        key = f"{section}.{name}" if section else name
        if name not in fields:
            raise unknown(key, name, fields, "key")
        typed = parse(value, types_[name], key)
        check_range(typed, fields[name].metadata, key)
        out[name] = typed
    return out


def build(cls: type, values: typing.Mapping[str, Any] | None, section: str) -> Any:
    """The section's dataclass from checked values; its ``validate(section)`` (rules across fields) runs last."""
    checked = check_section(cls, values or {}, section)
    try:
        obj = cls(**checked)
    except TypeError as err:  # a field without a default was not given
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in checked
                   and f.default is MISSING and f.default_factory is MISSING]
        raise LmforgeError(f"{section}.{missing[0]}: required" if missing else f"{section}: {err}") from None
    if hasattr(obj, "validate"):
        obj.validate(section)
    return obj


def default_values(cls: type) -> dict[str, Any]:
    """A section's defaults as plain values (fields without a default are left out)."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.default is not MISSING:
            out[f.name] = f.default
        elif f.default_factory is not MISSING:
            out[f.name] = f.default_factory()
    return out


def describe(f: dataclasses.Field) -> str:
    """A field's help with its default: ``peak learning rate (default 0.0003)``."""
    text = f.metadata.get("help", "")
    if f.default is not MISSING and f.default is not None and not isinstance(f.default, bool):
        text += f" (default {plain(f.default)})"
    return text.replace("%", "%%")


def plain(value: Any) -> Any:
    """A value as YAML-safe builtins: dataclasses as dicts, tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Text):
        return str(value)
    return value


# -- recipes: YAML sections + KEY=VALUE ------------------------------------------------------------------
def split_override(item: str) -> tuple[str, str, Text]:
    """``"train.lr=1e-3"`` -> ("train", "lr", Text("1e-3")).

    >>> split_override("model.norm=rmsnorm")
    ('model', 'norm', 'rmsnorm')
    """
    key, sep, value = item.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) != 2 or not all(parts):
        raise LmforgeError(f"{item}: expected SECTION.KEY=VALUE, e.g. train.lr=1e-3")
    return parts[0], parts[1], Text(value.strip())


def read_yaml(path: Path) -> dict[str, Any]:
    """A recipe file as a mapping of sections; unreadable bytes or YAML are one line naming the file."""
    import yaml

    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise LmforgeError(f"{path}: cannot read recipe: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise LmforgeError(f"{path}: not a YAML recipe: invalid UTF-8 at byte offset {err.start}") from None
    try:
        recipe = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise LmforgeError(f"{where}: invalid YAML: {getattr(err, 'problem', err)}") from None
    if not isinstance(recipe, dict) or not all(isinstance(v, dict | None) for v in recipe.values()):
        raise LmforgeError(f"{path}: a recipe is a mapping of sections, each a mapping of keys (train: {{lr: ...}})")
    return {str(k): dict(v or {}) for k, v in recipe.items()}


# A dataclass, or a function (values, the sections resolved before it) -> the section checked and completed
Schema = type | Callable[[dict[str, Any], dict[str, dict[str, Any]]], dict[str, Any]]


@dataclass(frozen=True)
class Recipe:
    """The sections a command reads (their schemas, in order) and the resume policy of the run it makes.

    ``fixed``: sections a resumed run must keep (its data, tokenizer, model, task), except the keys whose
    fields say ``may_change`` (how long, how often, how fast: not what is trained on).
    """

    sections: dict[str, Schema]
    fixed: tuple[str, ...] = ()

    def resolve(self, raw: typing.Mapping[str, typing.Mapping[str, Any]]) -> dict[str, Any]:
        """Every section checked and completed with its defaults, in order; an unknown section names the closest.

        Dataclass sections come back as instances, function-checked ones as dicts (``plain`` makes YAML of both).
        """
        for name in raw:
            if name not in self.sections:
                raise unknown(name, name, self.sections, "section")
        out: dict[str, Any] = {}
        for name, schema in self.sections.items():
            values = dict(raw.get(name) or {})
            out[name] = build(schema, values, name) if isinstance(schema, type) else schema(values, out)
        return out

    def may_change(self) -> set[str]:
        """``section.key`` names whose fields say ``may_change``."""
        return {f"{name}.{f.name}" for name, schema in self.sections.items() if isinstance(schema, type)
                for f in dataclasses.fields(schema) if f.metadata.get("may_change")}

    def resume_changes(self, saved_path: str | Path, recipe: typing.Mapping[str, Any]) -> list[str]:
        """Keys whose values differ from the run's recorded ``config.yaml`` ([] when there is none).

        A changed key of a fixed section is one line naming it and both values: resuming would train the saved
        weights on other data, or the record would lie.
        """
        path = Path(saved_path)
        if not path.is_file():
            return []
        saved, new = read_yaml(path), plain(dict(recipe))
        try:  # both completed the same way (a record from an older lmforge lacks today's defaults)
            saved = plain(self.resolve({k: v for k, v in saved.items() if k in self.sections}))
        except LmforgeError:
            saved = plain(saved)
        new = plain(self.resolve({k: v for k, v in new.items() if k in self.sections}))
        allowed = self.may_change()
        return refuse_changes(path, saved, new, lambda key: key.split(".")[0] in self.fixed and key not in allowed)


def refuse_changes(path: Path, saved: typing.Mapping[str, Any], new: typing.Mapping[str, Any],
                   fixed: Callable[[str], bool]) -> list[str]:
    """The keys that differ between a run's record and the settings now; a ``fixed`` one is one line naming it
    and both values (resuming would train the saved weights on other data, or the record would lie)."""
    changed = diff_recipes(saved, new)
    fatal = [k for k in changed if fixed(k)]
    if fatal:
        key = fatal[0]
        raise LmforgeError(f"{path}: {key} is {lookup(saved, key)!r} in this run but {lookup(new, key)!r} now; "
                           "the directory holds a run of other settings: rerun with its settings or choose a "
                           "new --out")
    return changed


def diff_recipes(old: typing.Mapping[str, Any], new: typing.Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two recipes.

    >>> diff_recipes({"train": {"lr": 1.0, "seed": 0}}, {"train": {"lr": 2.0, "seed": 0}})
    ['train.lr']
    """
    keys = []
    for k in sorted(set(old) | set(new), key=str):
        a, b = old.get(k), new.get(k)
        name = f"{prefix}{k}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys += diff_recipes(a, b, name + ".")
        elif plain(a) != plain(b):
            keys.append(name)
    return keys


def lookup(recipe: typing.Mapping[str, Any], key: str) -> Any:
    node: Any = plain(recipe)
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


RECIPES = Path(__file__).resolve().parent / "recipes"  # the recipes that ship with lmforge (configs/)


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


def load_recipe(recipe: Recipe, path: str | Path | None = None, overrides: Iterable[str] = (),
                given: typing.Mapping[str, typing.Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Resolve settings in order: defaults < the YAML file < KEY=VALUE overrides < ``given`` (flags).

    Returns the sections resolved (``Recipe.resolve``): what a run records in config.yaml (``plain``) and
    ``--print-config`` prints.
    """
    raw = read_yaml(find_recipe(path)) if path is not None else {}
    for item in overrides:
        section, key, value = split_override(item)
        raw.setdefault(section, {})[key] = value
    for section, values in (given or {}).items():
        raw.setdefault(section, {}).update(values)
    return recipe.resolve(raw)
