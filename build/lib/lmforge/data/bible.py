"""English–Spanish verse pairs from two public-domain Bibles: World English Bible and Reina-Valera 1909.

Debian ships both as SWORD modules (``apt-get install sword-text-web sword-text-sparv libsword-utils``);
``mod2imp MODULE`` prints one record per verse::

    $$$Genesis 1:1
    <w lemma="strong:H7225">EN el principio</w> <w lemma="strong:H1254">crió</w> ...

A record's OSIS markup is cleaned by dropping notes and titles, stripping the other tags and removing the
space before punctuation. Verses present in both translations form the pairs, except in chapters numbered
differently by the two versifications and where one side is much longer than the other; whole books are
held out for testing, so a test verse never shares a chapter with a training verse.

    >>> clean_osis('<w lemma="x">EN el principio</w> <w>crió</w> , <note>n</note>Dios.')
    'EN el principio crió, Dios.'
    >>> clean_osis('God said, “ <q>Let</q> there be light, ” and')
    'God said, “Let there be light,” and'
"""

from __future__ import annotations

import math
import re
import shutil
import statistics
import subprocess
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.files import write_text_atomic

ENGLISH, SPANISH = "engWEB2015eb", "spaRV1909eb"
PACKAGES = "sword-text-web sword-text-sparv libsword-utils"
TEST_BOOKS = ("Ruth", "Jonah", "Philippians", "James")  # whole books, from both testaments
PAIRS_VERSION = "2"  # 2: misnumbered chapters and length outliers left out
_RECORD = re.compile(r"^\$\$\$(.+?) (\d+):(\d+)\s*$")
_DROP = re.compile(r"<(note|title)\b[^>]*>.*?</\1>", re.S)
_TAG = re.compile(r"<[^>]+>")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)\]’”])")
_SPACE_AFTER_OPENING = re.compile(r"([(\[‘“])\s+")


def clean_osis(text: str) -> str:
    """Plain verse text from OSIS markup (see the module docstring)."""
    text = _TAG.sub(" ", _DROP.sub(" ", text))
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))
    text = _SPACE_AFTER_OPENING.sub(r"\1", text)
    return text.strip()


def read_module(module: str) -> dict[tuple[str, int, int], str]:
    """{(book, chapter, verse): text} of one SWORD module, via ``mod2imp``."""
    if shutil.which("mod2imp") is None:
        raise LmforgeError(f"mod2imp not found: install the Debian packages {PACKAGES}")
    run = subprocess.run(["mod2imp", module], capture_output=True, text=True, errors="replace")
    if run.returncode != 0 or "$$$" not in run.stdout:
        raise LmforgeError(f"mod2imp {module} failed: is {PACKAGES} installed? ({run.stderr.strip()[:120]})")
    return parse_imp(run.stdout)


def parse_imp(text: str) -> dict[tuple[str, int, int], str]:
    """Parse mod2imp output; headings (chapter or verse 0) and empty verses are skipped."""
    verses: dict[tuple[str, int, int], str] = {}
    key, lines = None, []

    def flush() -> None:
        if key is not None and key[1] > 0 and key[2] > 0:
            cleaned = clean_osis(" ".join(lines))
            if cleaned:
                verses[key] = cleaned

    for line in text.splitlines():
        match = _RECORD.match(line)
        if match:
            flush()
            key, lines = (match[1], int(match[2]), int(match[3])), []
        elif line.startswith("$$$"):
            flush()
            key, lines = None, []
        else:
            lines.append(line)
    flush()
    return verses


def aligned_pairs() -> list[tuple[tuple[str, int, int], str, str]]:
    """[((book, chapter, verse), english, spanish)] for verses present in both, in canonical order,
    without the chapters whose numbering differs between the two translations (``aligned_chapters``)
    and without pairs whose lengths disagree (``plausible_pair``)."""
    english, spanish = read_module(ENGLISH), read_module(SPANISH)
    pairs = [(key, text, spanish[key]) for key, text in english.items() if key in spanish]
    keep = aligned_chapters(english, spanish)
    return [(key, en, es) for key, en, es in pairs if key[:2] in keep and plausible_pair(en, es)]


def plausible_pair(english: str, spanish: str, max_ratio: float = 2.0, short: int = 40) -> bool:
    """False when one side is over ``max_ratio`` times longer (in characters) than the other, unless both are short.

    Catches verses that carry extra material in one translation (the WEB's glossary after Revelation 22:21).

    >>> plausible_pair("God said, “Let there be light,” and there was light.", "Y dijo Dios: Sea la luz: y fué la luz.")
    True
    >>> plausible_pair("Amen. " * 40, "Amén.")
    False
    """
    a, b = len(english), len(spanish)
    return max(a, b) <= short or max(a, b) <= max_ratio * min(a, b)


def aligned_chapters(english: dict, spanish: dict, max_median: float = 0.25) -> set[tuple[str, int]]:
    """Chapters whose verses line up: the same verse count in both, and a median |log(len_es / len_en)| at most
    ``max_median`` (aligned chapters sit near 0.09; a chapter whose numbering is shifted by a verse, as
    Numbers 13 or Jonah 2 are between these two versifications, pairs unrelated verses and scores 0.3-0.55).
    """
    verses: dict[tuple[str, int], list[float]] = {}
    counts: dict[tuple[str, int], list[int]] = {}
    for key, text in english.items():
        counts.setdefault(key[:2], [0, 0])[0] += 1
        if key in spanish:
            verses.setdefault(key[:2], []).append(abs(math.log(max(len(spanish[key]), 1) / max(len(text), 1))))
    for key in spanish:
        counts.setdefault(key[:2], [0, 0])[1] += 1
    return {chapter for chapter, logs in verses.items()
            if counts[chapter][0] == counts[chapter][1] and statistics.median(logs) <= max_median}


def write_pair_files(out_dir: str | Path, test_books: tuple[str, ...] = TEST_BOOKS) -> dict[str, Path]:
    """Write ``train.tsv`` and ``test.tsv`` (english<TAB>spanish) and return their paths; cached."""
    out = Path(out_dir)
    paths = {"train": out / "train.tsv", "test": out / "test.tsv"}
    version = out / "VERSION"  # files of an older selection rule are rebuilt
    if all(p.is_file() for p in paths.values()) and version.is_file() and version.read_text().strip() == PAIRS_VERSION:
        return paths
    pairs = aligned_pairs()
    out.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        rows = [f"{en}\t{es}" for (book, _, _), en, es in pairs if (book in test_books) == (name == "test")]
        write_text_atomic(path, "\n".join(rows) + "\n")
    write_text_atomic(version, PAIRS_VERSION + "\n")
    return paths
