"""Files never half-written, and text files read with one rule: what every package that saves or reads uses.

A reader (a resumed run, ``lmforge.load``, another process) sees the old file or the new one, never a
partial one: the content goes to a temporary file in the same directory, is flushed to disk, then renamed
over the target (``os.replace`` is atomic within one file system). A failure removes the temporary file.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> write_text_atomic(d / "a.txt", "hello"); (d / "a.txt").read_text()
    'hello'
    >>> with atomic_path(d / "b.bin") as tmp:       # any writer: np.save, save_file, fig.savefig ...
    ...     _ = tmp.write_bytes(b"xyz")
    >>> (d / "b.bin").read_bytes(), sorted(p.name for p in d.iterdir())
    (b'xyz', ['a.txt', 'b.bin'])

Every writer also says what it is about to write (``will_write``; ``atomic_path`` does it for its callers),
what it renames (``move``) and what it deletes (``remove_tree``): a claimed output (``lmforge.outputs``)
listens, so its record lists exactly the files its run wrote, never a file that was already there.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from lmforge.errors import LmforgeError

csv.field_size_limit(2**31 - 1)  # a CSV field may be as long as its file (Python's default stops at 131,072)

UMASK = os.umask(0o22)
os.umask(UMASK)  # read once: the mode a plain open(path, "w") would give


# -- what the writers announce: (event, paths) to each listener; lmforge.outputs keeps its run's files from it
Listener = Callable[[str, tuple[Path, ...]], None]
_LISTENERS: list[Listener] = []


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call ``listener(event, paths)`` for every ``will_write`` ("write"), ``move`` and ``remove_tree`` ("remove")
    of this process while the block runs."""
    _LISTENERS.append(listener)
    try:
        yield
    finally:
        _LISTENERS.remove(listener)


def _tell(event: str, *paths: str | os.PathLike) -> None:
    for listener in list(_LISTENERS):
        listener(event, tuple(Path(p) for p in paths))


def will_write(*paths: str | os.PathLike) -> None:
    """Say that these files are about to be written (before the first byte, so a crash leaves none unlisted)."""
    if _LISTENERS:
        _tell("write", *paths)


def move(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """``os.replace(source, target)`` (a file or a folder), told to the listeners: what was written as
    ``source`` is now ``target``."""
    os.replace(source, target)
    _tell("move", source, target)


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a folder this process wrote (errors ignored: what is gone is gone), told to the listeners."""
    shutil.rmtree(path, ignore_errors=True)
    _tell("remove", path)


TEMP_NAME = re.compile(r"\.(?P<stem>.+)\.[a-z0-9_]{8}\.tmp(?P<suffix>.*)")  # mkstemp's 8 random characters


def temp_target(name: str) -> str | None:
    """The file a temporary name of ``atomic_path`` was to become: ``.model.k3j_x9a2.tmp.safetensors`` ->
    ``model.safetensors``; None for any other name."""
    match = TEMP_NAME.fullmatch(name)
    return match and match["stem"] + match["suffix"]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside ``path`` to write to; on success it is fsynced and renamed over ``path``.

    The temporary name keeps ``path``'s suffix, so writers that choose a format by suffix still do; its
    pattern (``.{stem}.XXXXXXXX.tmp{suffix}``) is ``TEMP_NAME``: a crash's leftover is known by it.
    """
    path = Path(path)
    will_write(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~UMASK)  # mkstemp's 0600 would make every output private to its writer
        os.replace(tmp, path)
    except BaseException as err:
        tmp.unlink(missing_ok=True)
        if disk_full(err):
            raise LmforgeError(f"{path}: no space left on the device; nothing was written there (a previous "
                               f"{path.name}, if any, is intact): free some space and run the command again") from None
        raise


def copy_file(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Copy a file's bytes to ``target`` atomically."""
    with atomic_path(target) as tmp:
        shutil.copyfile(source, tmp)


def disk_full(err: BaseException) -> bool:
    """A write refused for want of space or quota (torch and safetensors report it in their own exceptions)."""
    return getattr(err, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(err)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a crash leaves the previous content intact."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: a crash leaves the previous content intact."""
    write_bytes_atomic(path, text.encode("utf-8"))


REPLACE_HINT = "fix the file, or replace bad bytes by U+FFFD: --errors replace, or data.errors=replace in a recipe"


def read_text_utf8(path: str | os.PathLike, what: str = "file", errors: str = "strict", hint: str | None = None
                   ) -> str:
    """The text of a UTF-8 file (a BOM dropped): the one reader of text files. A missing file, a directory,
    invalid UTF-8 (unless ``errors="replace"``: U+FFFD) or a NUL byte (a binary file) is one LmforgeError
    naming the file, and for bad bytes the line and byte offset; ``hint`` says how to proceed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise LmforgeError(f"{path}: is a directory, not a {what}") from None
    except FileNotFoundError:
        raise LmforgeError(f"{path}: no such {what}") from None
    except OSError as err:
        raise LmforgeError(f"{path}: cannot read ({err.strerror})") from None
    try:
        text = data.decode("utf-8-sig", errors=errors)
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise LmforgeError(f"{path}:{line}: invalid UTF-8 at byte offset {err.start} "
                           f"({hint or f'a {what} must be UTF-8 text'})") from None
    if "\x00" in text:
        raise LmforgeError(f"{path}: holds a NUL byte at byte offset {data.index(0)}: a binary file, not text")
    return text


def cache_dir() -> Path:
    """The folder of what lmforge fetches or builds once (data, compiled kernels): ``$LMFORGE_CACHE`` or
    ``~/.cache/lmforge``."""
    root = Path(os.environ.get("LMFORGE_CACHE", Path.home() / ".cache" / "lmforge"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The hex sha256 of a file, read in chunks (a 400 MB checkpoint takes about a second)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
