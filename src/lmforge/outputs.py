"""Outputs never overwrite what they should not: inputs, or a different artefact, silently.

Every command that writes a directory calls ``claim_output`` first, and ``record_output`` once the
output is complete. ``record_output`` leaves ``lmforge-output.json``: what the directory holds (its
``kind``: tokenizer, model, corpus, finetune), the settings that define it (``identity``), and the files
written. A later command writing there is then:

* refused, always, when the output is (or is inside) one of its input directories: ``finetune --out``
  equal to ``--model`` would overwrite the pretrained weights it reads;
* accepted when the directory is empty, or holds the same kind with the same identity (a rerun, a resume);
* refused when it holds a different artefact (another tokenizer, a model where a corpus goes, a LoRA
  output where a full fine-tune goes, or lmforge files with no record), naming what differs, unless
  ``overwrite=True`` (``--overwrite``): then the recorded files of the old artefact are removed first,
  so two kinds of weights never end up side by side.

    >>> import tempfile; d = Path(tempfile.mkdtemp()) / "tok"
    >>> claim_output(d, "tokenizer", {"vocab_size": 100}); record_output(d, "tokenizer", {"vocab_size": 100}, [])
    False
    >>> claim_output(d, "tokenizer", {"vocab_size": 100})          # the same output again: fine
    False
    >>> try:
    ...     claim_output(d, "tokenizer", {"vocab_size": 200})
    ... except LmforgeError as err:
    ...     print(str(err).split(": ", 1)[1])
    holds another tokenizer (vocab_size: 100, not 200); choose another --out or pass --overwrite
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic

RECORD_NAME = "lmforge-output.json"
# Files that say a directory already holds an artefact, even without a record (older lmforge, other tools).
ARTEFACT_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "adapter.safetensors",
                  "adapter_config.json", "tokenizer.json", "vocab.txt", "manifest.json", "train.tokens.npy")


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
    path = Path(out) / RECORD_NAME
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise LmforgeError(f"{path}: unreadable ({err})") from None


def claim_output(out: str | os.PathLike, kind: str, identity: dict[str, Any] | None = None,
                 overwrite: bool = False, inputs: Iterable[str | os.PathLike | None] = (),
                 flag: str | None = "--overwrite") -> bool:
    """Check that ``out`` may receive a ``kind`` artefact defined by ``identity`` (see the module docstring).

    flag: the option that allows overwriting, named in the refusal (None: the command has none).
    Returns True when an old artefact was removed (``overwrite``), False when there was nothing to replace.
    """
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise LmforgeError(f"{folder}: is a file, not a directory; choose a directory for --out")
    check_not_inside(folder, inputs)
    if not folder.is_dir():
        return False
    record = read_record(folder)
    identity = _plain(identity or {})
    if record is not None:
        if record.get("kind") == kind and record.get("identity") == identity:
            return False
        if record.get("kind") != kind:
            reason = f"holds a {record.get('kind')}, not a {kind}"
        else:
            old = record.get("identity") or {}
            key = next(k for k in sorted(set(old) | set(identity), key=str) if old.get(k) != identity.get(k))
            reason = f"holds another {kind} ({key}: {old.get(key)}, not {identity.get(key)})"
    else:
        found = [name for name in ARTEFACT_FILES if (folder / name).exists()]
        if not found:
            return False
        reason = f"already holds {found[0]} (an output of another command or an older lmforge)"
    if not overwrite:
        raise LmforgeError(f"{folder}: {reason}; choose another --out" + (f" or pass {flag}" if flag else ""))
    for name in (record or {}).get("files") or [n for n in ARTEFACT_FILES if (folder / n).is_file()]:
        path = folder / name
        if path.is_file() and path.resolve().parent == folder.resolve():
            path.unlink()
    (folder / RECORD_NAME).unlink(missing_ok=True)
    return True


def record_output(out: str | os.PathLike, kind: str, identity: dict[str, Any] | None,
                  files: Iterable[str]) -> None:
    """Write ``lmforge-output.json``: the directory now holds a complete ``kind`` artefact."""
    folder = Path(out)
    data = {"kind": kind, "identity": _plain(identity or {}), "files": sorted(set(files))}
    write_text_atomic(folder / RECORD_NAME, json.dumps(data, indent=1) + "\n")


def _plain(value: Any) -> Any:
    """JSON's view of a value (tuples as lists, paths as strings), so a record compares equal to a fresh one."""
    return json.loads(json.dumps(value, default=str))
