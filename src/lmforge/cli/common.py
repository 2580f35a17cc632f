"""What every command shares: one-line usage errors, flags derived from the settings schema, ``--quiet``, and
input lines read with one UTF-8 rule.

A command declares its settings once (``Settings``: the sections, which become flags); ``add_settings`` derives
the flags from the dataclass fields (type, choices, range, help, default), and ``resolve_settings`` merges
defaults < ``--config FILE.yaml`` < KEY=VALUE < flags through the schema's one checker (``lmforge.schema``).
Nothing here imports torch: the parser is built from these helpers before any command runs."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from lmforge.errors import LmforgeError
from lmforge.schema import Recipe, Text, check_range, default_values, find_recipe, parse, read_yaml, split_override


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on standard error (exit 2), like every other error.

    ``lmforge generate --beams 0`` → ``lmforge: error: lmforge generate: argument --beams/-b: must be ...``;
    ``--help`` still prints the whole usage.
    """

    def error(self, message: str):  # type: ignore[override]
        sys.stderr.write(f"lmforge: error: {self.prog}: {message} (see {self.prog} --help)\n")
        raise SystemExit(2)


@dataclass(frozen=True)
class Settings:
    """What a command reads: the sections of its settings (an ``lmforge.schema.Recipe``) and which become flags.

    flags: the sections whose fields are flags (``--lr`` for ``train.lr``); every section is also settable
        from ``--config FILE.yaml`` and, with ``overrides``, as KEY=VALUE arguments.
    defaults: this command's own default for a key (``{"decode.beams": 4}`` for translate).
    exclude: keys left out of the flags (``runtime.device`` where the recipe's ``train.device`` decides).
    """

    recipe: Recipe
    flags: tuple[str, ...] = ()
    defaults: Mapping[str, Any] = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    overrides: bool = False


def load_options(args: argparse.Namespace) -> dict[str, Any]:
    """``lmforge.load``'s keywords from a command's settings: the device (runtime) and, where the command has
    a weights section, the weights' dtype and int4 group size."""
    weights = args.settings.get("weights")
    out = {"device": args.settings["runtime"].device}
    if weights is not None:
        out.update(dtype=weights.dtype, group_size=weights.group_size)
    return out


def add_settings(p: argparse.ArgumentParser, settings: Settings) -> None:
    """Flags derived from the settings' fields, plus ``--config`` and ``--print-config`` (and KEY=VALUE)."""
    p.add_argument("--config", metavar="YAML", help="settings from a YAML file of sections (" +
                   ", ".join(f"{name}:" for name in settings.recipe.sections) + "); flags win over it")
    p.add_argument("--print-config", action="store_true", help="print the resolved settings as YAML and exit")
    if settings.overrides:
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="any setting as SECTION.KEY=VALUE, e.g. train.lr=1e-3 (see --print-config)")
    taken: dict[str, str] = {}
    for section in settings.flags:
        schema = settings.recipe.sections[section]
        group = p.add_argument_group(f"{section} settings")
        types_ = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            key = f"{section}.{f.name}"
            if not f.metadata.get("flag", True) or key in settings.exclude:
                continue
            flag = "--" + f.name.replace("_", "-")
            if flag in taken:
                raise ValueError(f"{flag} is both {taken[flag]} and {key}: exclude one")  # a bug, caught by a test
            taken[flag] = key
            default = settings.defaults.get(key, default_values(schema).get(f.name))
            add_flag(group, flag, key, f, types_[f.name], default)
    p.set_defaults(schema=settings)


def add_flag(group, flag: str, key: str, f: dataclasses.Field, hint: Any, default: Any) -> None:
    """One flag for one field: its type, choices and range checked by the schema's checker as argparse reads it."""
    meta = f.metadata
    names = [flag, meta["short"]] if meta.get("short") else [flag]
    help_ = meta.get("help", "")
    if default is not None and default != [] and not isinstance(default, bool):
        help_ += f" (default {default})"
    base = _without_none(hint)
    options: dict[str, Any] = {"dest": key, "default": argparse.SUPPRESS, "help": help_.replace("%", "%%")}
    if base is bool:
        group.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        return
    origin, args = typing.get_origin(base), typing.get_args(base)
    if origin in (typing.Union, types.UnionType) and bool in args:  # --compile (true), --compile auto / false
        options.update(nargs="?", const=True)
    if origin is list and args[0] is str:  # strings may hold commas and spaces: one a flag (--stop A --stop B)
        options.update(action="append", type=_checked(str, key, None))
    else:  # one value; numbers as a list or pair: --mix-weights 0,1,0   --betas 0.9,0.95
        options["type"] = _checked(hint, key, meta)
        if origin is Literal:
            options["choices"] = [a for a in args if a is not None]
    options["metavar"] = meta.get("metavar") or (None if "choices" in options else f.name.upper())
    group.add_argument(*names, **options)


def _without_none(hint: Any) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else hint
    return hint


def _checked(hint: Any, key: str, meta: Mapping[str, Any] | None):
    """An argparse ``type``: the schema's parse and range check, its message without the key (argparse names
    the flag: ``argument --top-k: must be >= 1, got 0``)."""
    def convert(text: str) -> Any:
        try:
            value = parse(Text(text), hint, key)
            if meta is not None:
                check_range(value, meta, key)
        except LmforgeError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"{key}: ")) from None
        return value

    convert.__name__ = getattr(_without_none(hint), "__name__", "value")
    return convert


def resolve_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The command's settings: its defaults < ``--config`` < KEY=VALUE < flags, each checked by the schema."""
    settings: Settings = args.schema
    raw: dict[str, dict[str, Any]] = {}
    for key, value in settings.defaults.items():
        section, name = key.split(".")
        raw.setdefault(section, {})[name] = value
    if args.config:
        for section, values in read_yaml(find_recipe(args.config)).items():
            raw.setdefault(section, {}).update(values)
    for item in getattr(args, "overrides", None) or []:
        section, name, value = split_override(item)
        raw.setdefault(section, {})[name] = value
    for dest, value in vars(args).items():
        if "." in dest:
            section, name = dest.split(".", 1)
            raw.setdefault(section, {})[name] = value
    return settings.recipe.resolve(raw)


OVERWRITE_HELP = ("replace an earlier lmforge output of another kind or settings in --out: only the files its "
                  "lmforge-output.json lists are removed; a folder holding files lmforge did not write is refused, "
                  "with or without this flag")
FILE_OVERWRITE_HELP = "replace an existing file at --out (without it an existing file is refused before any work)"


def add_quiet(p: argparse.ArgumentParser) -> None:
    """``--quiet`` on every command: no progress or logs on standard error (errors still show)."""
    p.add_argument("--quiet", action="store_true", help="no progress or logs on standard error (errors still show)")


def input_lines(given: list[str] | str | None, skip_blank: bool = False, errors: str = "strict") -> Iterator[str]:
    """The TEXT arguments, or standard input one line at a time (without its newline).

    Standard input is read as bytes and decoded like files: invalid UTF-8 stops with the line number and
    byte offset, unless ``errors="replace"`` (``--errors replace``) substitutes U+FFFD.
    """
    if isinstance(given, str) or given:  # "" is a text; None or [] read standard input
        yield from [given] if isinstance(given, str) else given
        return
    raw_lines = getattr(sys.stdin, "buffer", None) or sys.stdin  # bytes, unless stdin was replaced by text
    for n, raw in enumerate(raw_lines, start=1):
        try:
            line = raw.decode("utf-8", errors=errors) if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as err:
            raise LmforgeError(f"<stdin> line {n}: invalid UTF-8 at byte offset {err.start} "
                               "(fix the input or pass --errors replace)") from None
        line = line.rstrip("\n").removesuffix("\r")
        if skip_blank and not line.strip():
            continue
        yield line
