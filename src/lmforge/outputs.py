"""Outputs claim only what they wrote: a user's file in ``--out`` is never taken, replaced or deleted.

Every command that writes claims its output before any work, in one of two ways.

A folder (``claim_output``): it must be new, empty, or hold nothing but an earlier lmforge output, that is
the files listed in its record ``lmforge-output.json`` (and lmforge's run lock). A file or folder no record
lists is a user's: the folder is refused, with or without ``--overwrite``, naming what is there. Refusing
rather than working beside such files is the only safe choice: a run writes names of its own choosing
(``config.json``, ``train.jsonl``, ``log.jsonl``) and would replace a user's file that has one of them.
Then, against the record:

* the same kind and identity (the settings that define the output): a rerun or a resume, accepted;
* another kind or identity: refused naming what differs, unless ``overwrite`` (``--overwrite``); then the
  files the old record lists are removed, and nothing else: never a path outside the folder, never through a
  link, never a file the record does not list;
* an output equal to or inside one of the command's inputs is refused, always.

Used as ``with``, the claim locks the folder (``lmforge.lock.RunLock``), writes the record at once (not
complete yet: an interrupted run's files are listed too, so it resumes), and adds every file the run writes
as the writers announce it (``lmforge.files.will_write``, which every atomic write, checkpoint and log calls):
the list is what the run wrote, never a listing of the folder. On success the record is marked complete.

A folder of an earlier lmforge (a record without ``format``, which listed every file of its folder, a user's too;
or a pretraining or fine-tuning run, which kept no record) is adopted by a rerun of the same kind and identity:
the new record lists only lmforge's own artefacts there (``legacy_record``), and any other file makes the folder
refused as above. It is never trusted for deletion: another kind or identity is refused, with ``--overwrite`` too.

A single file (``claim_file``: a GGUF, an .npy, a picture): an existing path is refused unless ``overwrite``.
A file carries no record beside it, so lmforge cannot tell its own earlier output from a user's file of the
same name; with ``overwrite`` the new file replaces it atomically once it is complete.

    >>> import tempfile; d = Path(tempfile.mkdtemp()) / "tok"
    >>> with claim_output(d, "tokenizer", {"vocab_size": 100}):
    ...     write_text_atomic(d / "tokenizer.json", "{}")
    >>> read_record(d)["files"]
    ['tokenizer.json']
    >>> _ = (d / "notes.md").write_text("mine")        # a user's file beside the output
    >>> try:
    ...     claim_output(d, "tokenizer", {"vocab_size": 100}, overwrite=True)
    ... except LmforgeError as err:
    ...     print(str(err).split(": ", 1)[1])
    holds 1 file that lmforge did not write (notes.md); --overwrite never removes them: choose an empty or new --out
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.files import listening, temp_target, write_text_atomic
from lmforge.lock import LOCK_NAME, RunLock

RECORD_NAME = "lmforge-output.json"
RECORD_FORMAT = "lmforge-output/2"  # older records (no format) listed every file: see legacy_record


def check_not_inside(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None]) -> None:
    """Refuse an output directory equal to, or inside, an input directory (always: no flag overrides it)."""
    target = Path(out).resolve()
    for given in inputs:
        if given is None or not Path(given).is_dir():
            continue
        source = Path(given).resolve()
        if target == source or source in target.parents:
            raise LmforgeError(f"{out}: the output directory is {'' if target == source else 'inside '}the input "
                               f"directory {given}; writing there would overwrite what is being read: choose "
                               "another --out")


def read_record(out: str | os.PathLike) -> dict[str, Any] | None:
    """The folder's record, or None (no record, or one of an older lmforge whose list cannot be trusted)."""
    path = Path(out) / RECORD_NAME
    if not path.is_file() or path.is_symlink():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LmforgeError(f"{path}: unreadable ({err}); choose another --out") from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        return None
    if not isinstance(record.get("files"), list) or not all(isinstance(f, str) for f in record["files"]):
        raise LmforgeError(f"{path}: not an lmforge record (its files are not a list of names); choose another "
                           "--out")
    return record


# -- folders of earlier lmforge versions: adopted by a rerun of the same output, never trusted to delete -------
# Earlier versions wrote a record only when an output was complete, listing every file at its top (a user's too)
# and no subfolder; a pretraining run wrote none. A rerun of the same output adopts only lmforge's own artefacts
# there: names the old record lists that match LEGACY_LISTED, and paths matching LEGACY_UNLISTED (what those
# versions wrote without listing: a run's checkpoints and logs, a PEFT export's base/).
_TOKENIZER = (r"tokenizer\.json|tokenizer\.vocab|tokenizer_config\.json|special_tokens_map\.json|vocab\.txt|"
              r"vocab\.json|merges\.txt|checksums\.json")
_MODEL = (rf"{_TOKENIZER}|config\.json|model\.safetensors|adapter\.safetensors|adapter_config\.json|"
          r"adapter_model\.safetensors|finetune\.json|confusion\.png")
_CORPUS = r"manifest\.json|checksums\.json|(train|valid)\.(tokens|lines\.npy|docs\.npy)"
_STEP = (r"(step-\d{6}|\.(tmp|old)-step-\d{6}-\d+)/"  # train/checkpoint.py: a checkpoint, or one cut short
         r"(model\.safetensors|optimizer\.pt|trainer\.json|config\.json|checksums\.json)")
_TRAINER = rf"config\.yaml|log\.jsonl|loss\.png|tensorboard/events\.out\.tfevents\.[^/]+|checkpoints/(latest|{_STEP})"
LEGACY_LISTED = {"tokenizer": _TOKENIZER, "corpus": _CORPUS, "finetune": _MODEL, "model": _MODEL}
LEGACY_UNLISTED = {"run": rf"{_TRAINER}|tokenizer/({_TOKENIZER})|corpus(-source|-target)?/({_CORPUS}|lines\.txt)|"
                          rf"model/({_MODEL})",  # workflows/pretrain.py's run folder
                   "finetune": rf"run/({_TRAINER})", "model": rf"base/({_MODEL})",
                   "tokenizer": r"checksums\.json"}  # its record named only tokenizer.json and tokenizer.vocab
LEGACY_UNLISTED["demo"] = (  # workflows/demo.py's folder: the exercises' log, a pretraining run, a LoRA fine-tune
    rf"examples\.log|pretrain/({LEGACY_UNLISTED['run']})|finetune/data/(train|dev)\.csv|"
    rf"finetune/lora/({RECORD_NAME}|{_MODEL}|{LEGACY_UNLISTED['finetune']})")
LEGACY_WITHOUT_RECORD = {"run", "finetune", "demo"}  # kept none: a pretraining run, a fine-tune stopped early, a demo
LEGACY_SETTINGS = {"finetune": ("run/config.yaml", "finetune")}  # where such a run kept its settings
LEGACY_FOLDERS = re.compile(r"run|base|checkpoints|tokenizer|corpus(-source|-target)?|model|tensorboard|"
                            r"pretrain|finetune|lora|data|"
                            r"step-\d{6}|\.(tmp|old)-step-\d{6}-\d+")  # the folders above: no other is entered


def legacy_record(folder: Path, kind: str, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The output of an earlier lmforge in ``folder`` as a record (kind, identity, the files to adopt: see
    above), or None: no such output. Without an old record, a run of ``LEGACY_WITHOUT_RECORD`` is looked for,
    its identity read from its settings (``LEGACY_SETTINGS``), else taken to be ``identity`` (a pretraining run
    checks its config.yaml when it resumes)."""
    path = folder / RECORD_NAME
    listed: set[str] = set()
    if os.path.lexists(path):
        old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() and not path.is_symlink() else None
        if not isinstance(old, dict) or "format" in old or not isinstance(old.get("kind"), str):
            return None
        kind, identity = old["kind"], old.get("identity")
        listed = {f for f in old.get("files") or [] if isinstance(f, str)}
    elif kind not in LEGACY_WITHOUT_RECORD:
        return None
    elif kind in LEGACY_SETTINGS:
        identity = _settings(folder / LEGACY_SETTINGS[kind][0], LEGACY_SETTINGS[kind][1], identity)
    top, under = re.compile(LEGACY_LISTED.get(kind, "(?!)")), re.compile(LEGACY_UNLISTED.get(kind, "(?!)"))
    files = []
    for parent, folders, names in os.walk(folder):  # links are not followed
        folders[:] = [f for f in folders if LEGACY_FOLDERS.fullmatch(f)]
        found = (Path(parent, n).relative_to(folder).as_posix() for n in names)
        files += [f for f in found if (f in listed and top.fullmatch(f)) or under.fullmatch(f)]
    return {"kind": kind, "identity": identity, "files": files} if files or os.path.lexists(path) else None


def _settings(path: Path, section: str, identity: dict[str, Any]) -> dict[str, Any]:
    """``identity``'s keys as the run's ``config.yaml`` (``path``) holds them in ``section`` (none or unreadable:
    ``identity`` as given)."""
    import yaml

    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))[section]
        return {key: saved[key] for key in identity}
    except (OSError, ValueError, yaml.YAMLError, TypeError, KeyError):
        return identity


class Output:
    """A claimed output folder; see the module docstring. Made by ``claim_output``."""

    def __init__(self, folder: Path, kind: str, identity: dict[str, Any], overwrite: bool, flag: str | None):
        self.folder, self.kind, self.identity, self.overwrite, self.flag = folder, kind, identity, overwrite, flag
        self.files: set[str] = set()
        self._mutex = threading.RLock()
        self._lock: RunLock | None = None
        self._listening: Any = None
        self.check()  # read only: a refusal comes before any work and changes nothing

    def check(self) -> tuple[list[Path], set[str], bool]:
        """(the old output's files, the names to keep listing, whether the old output is to be removed);
        raises when the folder is not this command's to write."""
        folder = self.folder
        if os.path.lexists(folder) and not folder.is_dir():
            raise LmforgeError(f"{folder}: is a file, not a directory; choose a directory for --out")
        if not folder.is_dir():
            return [], set(), False
        record = read_record(folder)
        earlier = record is None and os.path.lexists(folder / RECORD_NAME)  # a record of an earlier lmforge
        if record is None and (record := legacy_record(folder, self.kind, self.identity)) and (
                reason := self.differs(record)):  # an earlier record listed user files too: never trusted to delete
            raise LmforgeError(f"{folder}: {reason}, written by an earlier lmforge, whose files lmforge cannot tell "
                               "from yours: it removes nothing there, not even with --overwrite; choose another --out, "
                               "or move that folder away")
        ours, foreign = survey(folder, set(record["files"]) if record else set())
        if foreign:
            shown = ", ".join(foreign[:4]) + (", ..." if len(foreign) > 4 else "")
            noun = "file or folder" if any(f.endswith("/") for f in foreign) else "file"
            noun = noun.replace("file", "files").replace("folder", "folders") if len(foreign) > 1 else noun
            older = f" (its {RECORD_NAME} is an older lmforge's, which listed every file in the folder)" * earlier
            raise LmforgeError(f"{folder}: holds {len(foreign)} {noun} that lmforge did not write ({shown}){older}; "
                               "--overwrite never removes them: choose an empty or new --out")
        listed = {p.relative_to(folder).as_posix() for p in ours if temp_target(p.name) is None}
        reason = record and self.differs(record)
        if not reason:  # no output there, or this one: a rerun, a resume
            return ours, listed, False
        if not listed:  # an output that failed before writing a file: nothing to lose
            return ours, set(), True
        if not self.overwrite:
            raise LmforgeError(f"{folder}: {reason}; choose another --out" +
                               (f" or pass {self.flag} (it removes only the files that output's {RECORD_NAME} "
                                "lists)" if self.flag else ""))
        return ours, set(), True

    def differs(self, record: dict[str, Any]) -> str | None:
        """How the output ``record`` describes differs from this one ("holds a ..."); None: the same one."""
        if record.get("kind") != self.kind:
            return f"holds a {record.get('kind')}, not a {self.kind}"
        old = record.get("identity")
        if old == self.identity:
            return None
        old = old if isinstance(old, dict) else {}
        keys = [k for k in sorted(set(old) | set(self.identity), key=str) if old.get(k) != self.identity.get(k)]
        return f"holds another {self.kind}" + "".join(f" ({k}: {old.get(k)}, not {self.identity.get(k)})"
                                                      for k in keys[:1])

    def __enter__(self) -> Output:
        self._lock = RunLock(self.folder).acquire()
        self.root = self.folder.resolve()
        try:
            ours, listed, replace = self.check()  # again, under the lock: another run may have been quicker
            if replace:
                remove(self.folder, ours)
            self.files = listed
            self.save(complete=False)
            self._listening = listening(self.heard)
            self._listening.__enter__()
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        try:
            self._listening.__exit__(None, None, None)
            if kind is None:
                self.save(complete=True)
        finally:
            self._lock.release()

    def save(self, complete: bool) -> None:
        """Write the record: kind, identity, whether the output is complete, and the files written so far."""
        with self._mutex:
            self.complete = complete
            data = {"format": RECORD_FORMAT, "kind": self.kind, "identity": self.identity, "complete": complete,
                    "files": sorted(self.files)}
            write_text_atomic(self.folder / RECORD_NAME, json.dumps(data, indent=1) + "\n")

    def heard(self, event: str, paths: tuple[Path, ...]) -> None:
        """A writer's announcement (``lmforge.files``): add, rename or drop the files it names inside the folder."""
        names = [self.relative(p) for p in paths]
        with self._mutex:
            before = set(self.files)
            if event == "write":
                self.files.update(n for n in names if n is not None and n != RECORD_NAME)
            elif names[0] is not None:  # "move" (source, target) or "remove" (path): a file or a folder
                moved = {f for f in self.files if f == names[0] or f.startswith(names[0] + "/")}
                self.files -= moved
                if event == "move" and names[1] is not None:
                    self.files |= {names[1] + f[len(names[0]):] for f in moved}
            if self.files != before:
                self.save(self.complete)

    def relative(self, path: Path) -> str | None:
        """``path`` relative to the folder (its parent resolved, the name itself not followed), or None outside."""
        try:
            return (Path(path).absolute().parent.resolve() / Path(path).name).relative_to(self.root).as_posix()
        except ValueError:
            return None


def claim_output(out: str | os.PathLike, kind: str, identity: dict[str, Any] | None = None,
                 overwrite: bool = False, inputs: Iterable[str | os.PathLike | None] = (),
                 flag: str | None = "--overwrite") -> Output:
    """Claim the folder ``out`` for a ``kind`` output defined by ``identity`` (see the module docstring).

    Refuses at once (nothing written) when ``out`` is not this command's to write; use the result as ``with``
    around the work. flag: the option that allows replacing another output, named in the refusal (None: the
    command has none).
    """
    check_not_inside(out, inputs)
    return Output(Path(out), kind, _plain(identity or {}), overwrite, flag)


def claim_file(path: str | os.PathLike, overwrite: bool = False, inputs: Iterable[str | os.PathLike | None] = (),
               flag: str = "--overwrite", what: str = "--out") -> Path:
    """Claim a single-file output: refused when ``path`` is a folder or one of the command's inputs, and when
    it exists unless ``overwrite`` (a file has no record: lmforge cannot tell its own from a user's)."""
    path = Path(path)
    if path.is_dir():
        raise LmforgeError(f"{what}: {path} is a directory; give a file name")
    for given in inputs:
        if given is not None and path.exists() and Path(given).exists() and path.samefile(given):
            raise LmforgeError(f"{what}: {path} is an input of this command; choose another file name")
    if os.path.lexists(path) and not overwrite:
        raise LmforgeError(f"{what}: {path} already exists, and lmforge cannot tell its own earlier output from "
                           f"a file of yours: choose another name, or pass {flag} to replace it")
    return path


def survey(folder: Path, recorded: set[str]) -> tuple[list[Path], list[str]]:
    """(the regular files under ``folder`` that ``recorded`` lists, with the temporary files of their atomic
    writes; the paths of everything else, relative, folders ending in /).

    Only folders that hold recorded files are entered, and no link is followed (a link is always foreign).
    A folder that holds no file at all, and lmforge's lock files (a process id), count as nothing.
    """
    prefixes = {"/".join(parts[:n]) for parts in (f.split("/") for f in recorded) for n in range(1, len(parts))}
    ours: list[Path] = []
    foreign: list[str] = []

    def walk(directory: Path, rel: str) -> None:
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            name = rel + entry.name
            target = temp_target(entry.name)
            if (not rel and entry.name == RECORD_NAME) or _is_lock(entry):
                continue
            if entry.is_symlink():
                foreign.append(name)
            elif entry.is_dir(follow_symlinks=False):
                if name in prefixes:
                    walk(Path(entry.path), name + "/")
                elif _holds_files(Path(entry.path)):
                    foreign.append(name + "/")
            elif entry.is_file(follow_symlinks=False) and (
                    name in recorded or (target is not None and (rel + target in recorded or target == RECORD_NAME))):
                ours.append(Path(entry.path))
            else:
                foreign.append(name)

    walk(folder, "")
    return ours, foreign


def remove(folder: Path, files: list[Path]) -> None:
    """Delete ``files`` (what ``survey`` found ours), then the folders under ``folder`` they leave empty."""
    for path in files:
        path.unlink(missing_ok=True)
    for parent in sorted({p.parent for p in files}, key=lambda p: len(p.parts), reverse=True):
        while parent != folder and folder in parent.parents:
            try:
                parent.rmdir()  # only an empty one; a folder still holding anything stays
            except OSError:
                break
            parent = parent.parent


def _is_lock(entry: os.DirEntry) -> bool:
    """lmforge's run lock (``.lock`` holding a process id, or nothing): kept by the kernel, not by the record."""
    if entry.name != LOCK_NAME or not entry.is_file(follow_symlinks=False) or entry.stat().st_size > 32:
        return False
    with open(entry.path, encoding="utf-8", errors="replace") as f:
        return f.read().strip().isdigit() or entry.stat().st_size == 0


def _holds_files(folder: Path) -> bool:
    """Whether anything but folders and lmforge's locks (a file, a link) is under ``folder``; no link followed."""
    for entry in os.scandir(folder):
        if entry.is_dir(follow_symlinks=False):
            if _holds_files(Path(entry.path)):
                return True
        elif not _is_lock(entry):
            return True
    return False


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples as lists, paths as strings), so a record compares equal to a fresh one."""
    return json.loads(json.dumps(value, default=str))
