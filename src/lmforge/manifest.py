"""Checksums: a directory says what it holds, so a flipped byte or a truncated copy is caught before use.

Every checkpoint and every saved model directory ends with ``checksums.json``, written last and
atomically: the sha256 and size of each file written before it. A reader verifies the files it is about
to use against it; a mismatch is one line naming the file. A directory without the manifest loads
unverified when someone else wrote it (a Hugging Face download: its format is checked as it is read) and is
refused when lmforge did (its config.json names the lmforge version; a checkpoint; an lmforge tokenizer.json).

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> _ = (d / "w.bin").write_bytes(b"weights")
    >>> _ = write_manifest(d, ["w.bin"]); verify_manifest(d)
    True
    >>> _ = (d / "w.bin").write_bytes(b"weightz")
    >>> try:
    ...     verify_manifest(d)
    ... except LmforgeError as err:
    ...     print(str(err).split("/")[-1])
    w.bin: sha256 differs from checksums.json (the file is corrupt or was changed)

Hashing reads each file once: cheap next to training, noticeable for a model of many gigabytes (the rate:
docs/benchmarks.md), hence ``verify=False`` in ``lmforge.load`` and ``--no-verify`` on the commands.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.files import sha256_file, write_text_atomic

VERSION = "0.1.0"  # lmforge's version (lmforge.__version__), recorded in what it writes
MANIFEST_NAME = "checksums.json"
VERIFY = {"default": True}  # the process-wide default of ``verify`` (``--no-verify`` turns it off)


def write_manifest(directory: str | os.PathLike, names: Iterable[str] | None = None) -> Path:
    """Record sha256 and size of ``names`` (default: every file directly in ``directory``); return the path.

    Entries of an existing manifest for files not named again are kept if the file is still there, so
    a directory written in parts (weights, then the tokenizer) ends with one manifest covering all.
    """
    folder = Path(directory)
    path = folder / MANIFEST_NAME
    if names is None:
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_NAME
                       and not p.name.startswith("."))
    entries = {n: e for n, e in read_manifest(folder).items() if (folder / n).is_file()}
    for name in names:
        file = folder / name
        entries[name] = {"sha256": sha256_file(file), "bytes": file.stat().st_size}
    write_text_atomic(path, json.dumps({"format": "lmforge-checksums/1", "files": entries}, indent=1) + "\n")
    return path


def read_manifest(directory: str | os.PathLike) -> dict[str, dict]:
    """{file name: {"sha256", "bytes"}} of ``directory``'s manifest; {} when it has none."""
    path = Path(directory) / MANIFEST_NAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        files = data["files"]
        if not isinstance(files, dict):
            raise TypeError("files is not a mapping")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LmforgeError(f"{path}: unreadable checksum manifest ({err})") from None
    return files


def verify_manifest(directory: str | os.PathLike, required: Iterable[str] = (), verify: bool | None = None,
                    lmforge_written: bool = False) -> bool:
    """Check every file the manifest lists (and that each of ``required`` is listed); False if no manifest.

    A missing file, a size or sha256 that differs, or a required file the manifest does not list is an
    ``LmforgeError`` naming the file. ``verify=False`` (or ``--no-verify``) skips the check. A directory that
    lmforge wrote (``lmforge_written``: it always writes a manifest there) without one is refused.
    """
    folder = Path(directory)
    entries = manifest_to_check(folder, verify, lmforge_written)
    if entries is None:
        return False
    for name in required:
        if name not in entries and (folder / name).exists():
            raise not_listed(folder / name)
    for name, entry in entries.items():
        check_entry(folder / name, entry)
    return True


def verify_files(directory: str | os.PathLike, names: Iterable[str], verify: bool | None = None,
                 lmforge_written: bool = False) -> bool:
    """Check only ``names`` against ``directory``'s manifest (a tokenizer read from a model or run folder).

    Each must be listed, with its size and sha256. Without a manifest: False, unless ``lmforge_written``
    (the file carries lmforge's format marker, so a manifest was written beside it and is now missing), which
    is an ``LmforgeError`` saying how to proceed.
    """
    folder = Path(directory)
    entries = manifest_to_check(folder, verify, lmforge_written)
    if entries is None:
        return False
    for name in names:
        if name not in entries:
            raise not_listed(folder / name)
        check_entry(folder / name, entries[name])
    return True


def manifest_to_check(folder: Path, verify: bool | None, lmforge_written: bool) -> dict[str, dict] | None:
    """The manifest's entries, or None when there is nothing to check (verification off, or no manifest in a
    folder someone else wrote); a folder lmforge wrote without its manifest is refused."""
    if not (VERIFY["default"] if verify is None else verify):
        return None
    if not (folder / MANIFEST_NAME).is_file():
        if lmforge_written:
            raise missing_manifest(folder)
        return None
    return read_manifest(folder)


def check_entry(file: Path, entry: dict) -> None:
    """``file`` exists with the size and sha256 its manifest entry records, or one line naming it."""
    if not file.is_file():
        raise LmforgeError(f"{file}: listed in {MANIFEST_NAME} but missing")
    size = file.stat().st_size
    if size != entry.get("bytes"):
        raise LmforgeError(f"{file}: {size} bytes, {MANIFEST_NAME} records {entry.get('bytes')} "
                           "(truncated or changed)")
    if sha256_file(file) != entry.get("sha256"):
        raise LmforgeError(f"{file}: sha256 differs from {MANIFEST_NAME} (the file is corrupt or was changed)")


def not_listed(file: Path) -> LmforgeError:
    return LmforgeError(f"{file}: not listed in {MANIFEST_NAME} (written after it, or the manifest was edited); "
                        "cannot vouch for it (--no-verify reads it unverified)")


def missing_manifest(folder: Path) -> LmforgeError:
    return LmforgeError(f"{folder}: lmforge wrote this but its {MANIFEST_NAME} is missing, so nothing in it can be "
                        "vouched for; restore it, or read it unverified (--no-verify, verify=False)")


def set_verify(enabled: bool) -> None:
    """Set the default of ``verify`` for this process (the commands' ``--no-verify``)."""
    VERIFY["default"] = enabled
