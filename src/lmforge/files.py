"""Files that are never half-written: what every package that saves something uses.

A reader (a resumed run, ``lmforge.load``, another process) sees the old file or the new one, never a
partial one: the text goes to a temporary file in the same directory, is flushed to disk, then renamed
over the target (``os.replace`` is atomic within one file system).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: a crash leaves the previous content intact."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
