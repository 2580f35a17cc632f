"""Text, JSONL, CSV or Parquet/Arrow files → memory-mapped token shards with document and line boundaries.

A prepared corpus is a folder:

    manifest.json          tokenizer hash, vocabulary size, counts, dtype, the files it came from
    train.tokens           all token ids of the training documents, end to end (uint16 or uint32)
    train.lines.npy        int64 offsets: line i is tokens[lines[i]:lines[i+1]]
    train.docs.npy         int64 offsets into the lines: document d is lines[docs[d]:docs[d+1]]
    valid.*                the same for the validation documents

Lines are the segments that next-sentence prediction pairs, each stored with its line break (a token for
byte-level BPE); documents are what "another document" means for its negatives, and each ends with the
tokenizer's end-of-text token when it has one, so causal LM sees where one text stops and the next begins.
A text file is one document, or one per blank-line-separated block with ``doc_separator="blank-line"``;
a JSONL line, a CSV row or a row of a Parquet/Arrow file or saved Hugging Face dataset is one document
(field ``text``).

    >>> corpus = prepare_corpus(["play.txt"], tokenizer, "data/shakespeare")     # doctest: +SKIP
    >>> TokenShard.open("data/shakespeare", "train").n_tokens                     # doctest: +SKIP
    1325021
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from lmforge.errors import LmforgeError
from lmforge.files import REPLACE_HINT, atomic_path, disk_full, read_text_utf8, write_bytes_atomic
from lmforge.manifest import verify_files, write_manifest
from lmforge.tokenizers.train import PIECE_CHARS, bounded_pieces
from lmforge.workers import pool

MANIFEST = "manifest.json"
SHARD_FILES = (".tokens", ".lines.npy", ".docs.npy")  # per split
# How to go past invalid UTF-8, for every command that reads text (pretrain reads data.errors from its recipe).


# -- reading documents --------------------------------------------------------------------------------------
def iter_documents(path: Path, doc_separator: str = "file", field: str = "text",
                   errors: str = "strict") -> Iterator[list[str]]:
    """Yield each document of a file as its list of non-empty lines.

    .txt: the whole file (``doc_separator="file"``) or blocks between blank lines ("blank-line").
    .jsonl: one document per line, from ``field``. .csv / .tsv: one per row, from the column ``field``.
    .parquet, .arrow and folders written by ``Dataset.save_to_disk``: one per row, through Hugging Face
    ``datasets`` (local files only; ``iter_dataset_documents``).
    """
    if path.suffix.lower() in DATASET_SUFFIXES or path.is_dir():
        yield from iter_dataset_documents(path, field)
        return
    suffix = path.suffix.lower()
    if not path.is_file():
        raise LmforgeError(f"{path}: no such file")
    text = read_text_utf8(path, "corpus file", errors, REPLACE_HINT)
    if suffix == ".jsonl":
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise LmforgeError(f"{path}:{number}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise LmforgeError(f"{path}:{number}: missing string field {field!r}")
            yield _lines(record[field])
    elif suffix in (".csv", ".tsv"):
        reader = csv.DictReader(text.splitlines(), delimiter="\t" if suffix == ".tsv" else ",")
        if reader.fieldnames is None or field not in reader.fieldnames:
            raise LmforgeError(f"{path}: no column {field!r} (columns: {', '.join(reader.fieldnames or [])})")
        for row in reader:
            yield _lines(row[field] or "")
    elif doc_separator == "blank-line":
        for block in text.split("\n\n"):
            lines = _lines(block)
            if lines:
                yield lines
    else:
        yield _lines(text)


DATASET_SUFFIXES = (".parquet", ".arrow")


def iter_dataset_documents(path: Path, field: str = "text", batch: int = 1024) -> Iterator[list[str]]:
    """Rows of a local Parquet file, Arrow file or ``save_to_disk`` folder, read with Hugging Face ``datasets``.

    Each row's ``field`` is one document. A saved ``DatasetDict`` contributes its "train" split.
    """
    try:
        import datasets
    except ImportError:
        raise LmforgeError(f"{path}: reading Parquet/Arrow/dataset folders needs Hugging Face datasets "
                           "(pip install datasets)") from None
    if not path.exists():
        raise LmforgeError(f"{path}: no such file or folder")
    try:
        if path.is_dir():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if "train" not in ds:
                    raise LmforgeError(f"{path}: a DatasetDict without a 'train' split ({', '.join(ds)})")
                ds = ds["train"]
        elif path.suffix.lower() == ".parquet":
            ds = datasets.Dataset.from_parquet(str(path))
        else:
            ds = datasets.Dataset.from_file(str(path))
    except (FileNotFoundError, ValueError, OSError) as err:
        raise LmforgeError(f"{path}: cannot read as a dataset ({str(err).splitlines()[0][:160]})") from None
    if field not in ds.column_names:
        raise LmforgeError(f"{path}: no column {field!r} (columns: {', '.join(ds.column_names)})")
    number = 0
    for rows in ds.select_columns([field]).iter(batch_size=batch):
        for text in rows[field]:
            if text is not None and not isinstance(text, str):
                raise LmforgeError(f"{path}: row {number}: column {field!r} holds {type(text).__name__}, not text")
            number += 1
            yield _lines(text or "")


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


# -- tokenizing in worker processes ---------------------------------------------------------------------
_WORKER_TOKENIZER, _WORKER_BREAKS = None, True


def _init_worker(tokenizer, line_breaks: bool) -> None:
    global _WORKER_TOKENIZER, _WORKER_BREAKS
    _WORKER_TOKENIZER, _WORKER_BREAKS = tokenizer, line_breaks


def encode_lines(tokenizer, lines: Sequence[str], line_breaks: bool = True) -> list[np.ndarray]:
    """Token ids of each line with its line break, without special tokens (batches add those).

    The break is a token only for tokenizers that represent whitespace (byte-level BPE: 'Ċ'); WordPiece and
    Sennrich BPE drop it, as they drop every space. ``line_breaks=False`` leaves it out (one sentence a line,
    as in translation pairs). A long line is encoded a bounded piece at a time (``bounded_pieces``) and
    kept as a compact array: memory stays a few times the text, even for one line of 50 MB.
    """
    end = "\n" if line_breaks else ""
    encode = getattr(tokenizer, "encode_ordinary", None)
    if not callable(encode):
        def encode(text: str) -> list[int]:
            return tokenizer.encode(text, add_special_tokens=False).ids
    dtype = shard_dtype(tokenizer.vocab_size)
    out = []
    for line in lines:
        if len(line) <= PIECE_CHARS:
            out.append(np.asarray(encode(line + end), dtype=dtype))
            continue
        ids, previous = [], None
        for piece in bounded_pieces(line):  # the break goes with the last piece, as with the whole line
            if previous is not None:
                ids.append(np.asarray(encode(previous), dtype=dtype))
            previous = piece
        ids.append(np.asarray(encode(previous + end), dtype=dtype))
        out.append(np.concatenate(ids))
    return out


def shard_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer type that holds every id: 2 bytes a token up to 65,536 tokens."""
    return np.dtype(np.uint16 if vocab_size <= 2**16 else np.uint32)


def _encode_chunk(lines: list[str]) -> list[list[int]]:
    return encode_lines(_WORKER_TOKENIZER, lines, _WORKER_BREAKS)


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of the tokenizer's saved form, so a corpus is never silently used with another tokenizer."""
    payload = json.dumps(tokenizer.to_dict(), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:16]


# -- writing shards ---------------------------------------------------------------------------------
@dataclass
class Split:
    tokens: list[np.ndarray]
    line_lengths: list[int]
    doc_lines: list[int]

    def write(self, out: Path, name: str, dtype: np.dtype, written: list[Path]) -> dict[str, int]:
        """The split's three files, each atomically; ``written`` gets each path once it is in place."""
        if len(self.tokens) == 1:  # one long document: no copy
            tokens = self.tokens[0].astype(dtype, copy=False)
        else:
            tokens = np.concatenate(self.tokens).astype(dtype, copy=False) if self.tokens else np.zeros(0, dtype)
        lines = np.concatenate([[0], np.cumsum(self.line_lengths, dtype=np.int64)]).astype(np.int64)
        docs = np.concatenate([[0], np.cumsum(self.doc_lines, dtype=np.int64)]).astype(np.int64)
        with atomic_path(out / f"{name}.tokens") as tmp:
            tokens.tofile(tmp)  # no in-memory copy of a large shard
        written.append(out / f"{name}.tokens")
        for suffix, array in ((".lines.npy", lines), (".docs.npy", docs)):
            _atomic_save_npy(out / f"{name}{suffix}", array)
            written.append(out / f"{name}{suffix}")
        return {"tokens": int(tokens.size), "lines": len(self.line_lengths), "documents": len(self.doc_lines)}


def write_splits(splits: dict[str, Split], out: Path, dtype: np.dtype) -> dict[str, dict[str, int]]:
    """Write every split; a full disk is one line naming the directory and the size needed. A failure removes
    the shard files this call had written: without all of them (and the manifest, written last) they are no
    corpus, and an older corpus's files that were not yet replaced stay as they were."""
    written: list[Path] = []
    try:
        return {name: split.write(out, name, dtype, written) for name, split in splits.items()}
    except BaseException as err:
        for path in written:
            path.unlink(missing_ok=True)
        if not isinstance(err, OSError):
            raise
        need = sum(sum(t.size for t in split.tokens) for split in splits.values()) * dtype.itemsize
        if not disk_full(err) and shutil.disk_usage(out).free >= need:  # numpy's short write has no errno
            raise
        raise LmforgeError(f"{out}: no space left on the device while writing the corpus shards (about "
                           f"{need / 2**20:.1f} MiB needed)") from None


def _atomic_save_npy(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp:
        np.save(tmp, array)


def prepare_corpus(
    files: Sequence[str | Path],
    tokenizer,
    out_dir: str | Path,
    val_fraction: float = 0.1,
    doc_separator: str = "file",
    field: str = "text",
    workers: int | None = None,
    seed: int = 0,
    errors: str = "strict",
    progress: bool = True,
    line_breaks: bool = True,
) -> dict:
    """Tokenize files into train/valid shards; return the manifest.

    About ``val_fraction`` of the characters are held out for validation, whole documents where their
    sizes allow, else the tail of each document (``held_out``). ``val_fraction=0`` holds out nothing.
    ``line_breaks=False`` stores each line without its break and without an end-of-text token closing the
    document: a corpus of independent sentences (translation pairs).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [Path(f) for f in files]
    if not paths:
        raise LmforgeError("no input files given")
    docs = [doc for p in paths for doc in iter_documents(p, doc_separator, field, errors) if doc]
    if not docs:
        raise LmforgeError(f"{', '.join(map(str, paths))}: no text found (empty corpus)")
    docs, is_val = held_out(docs, val_fraction, seed)
    all_lines = [line for doc in docs for line in doc]
    encoded = _encode_all(tokenizer, all_lines, workers, progress, line_breaks)
    eos = getattr(tokenizer, "eos_id", None) if line_breaks else None  # ends each document (GPT-2's <|endoftext|>)
    splits = split_documents(docs, encoded, is_val, eos)

    vocab_size = int(tokenizer.vocab_size)
    dtype = shard_dtype(vocab_size)
    manifest = {
        "format": "lmforge-shards/1",
        "tokenizer_hash": tokenizer_fingerprint(tokenizer),
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "files": [str(p) for p in paths],
        "characters": sum(len(line) for line in all_lines),
        "splits": write_splits(splits, out, dtype),
    }
    write_bytes_atomic(out / MANIFEST, json.dumps(manifest, indent=2).encode())
    write_manifest(out, [MANIFEST, *(f"{s}{ext}" for s in manifest["splits"] for ext in SHARD_FILES)])  # content
    return manifest


def held_out(docs: list[list[str]], val_fraction: float, seed: int) -> tuple[list[list[str]], np.ndarray]:
    """(documents, which are validation): about ``val_fraction`` of the characters held out, whole documents
    where they allow it.

    1. a seeded random ``round(val_fraction · n)`` documents (at least one), when that holds out between half
       and twice ``val_fraction`` of the characters;
    2. else documents in seeded random order, each taken while the held-out share stays under 1.25 ·
       ``val_fraction`` (few documents of uneven sizes);
    3. else (one document, or documents all too large) the last ``val_fraction`` of every document's lines.

    ``val_fraction=0`` holds out nothing.

    >>> docs = [["a" * 10] * 9, ["b" * 10]]                       # 90 and 10 characters
    >>> _, is_val = held_out(docs, 0.1, 0); is_val.tolist()        # rule 1 or 2: the small one
    [False, True]
    >>> parts, is_val = held_out([["x"] * 10], 0.2, 0)             # rule 3: the tail of the only document
    >>> [len(p) for p in parts], is_val.tolist()
    ([8, 2], [False, True])
    """
    n = len(docs)
    if val_fraction <= 0 or n == 0:
        return docs, np.zeros(n, dtype=bool)
    sizes = np.array([sum(len(line) + 1 for line in doc) for doc in docs], dtype=np.float64)
    total = sizes.sum()
    order = np.random.default_rng(seed).permutation(n)
    is_val = np.zeros(n, dtype=bool)
    if n >= 2:
        is_val[order[:max(1, round(val_fraction * n))]] = True
        share = sizes[is_val].sum() / total
        if 0.5 * val_fraction <= share <= 2 * val_fraction:
            return docs, is_val
        is_val[:] = False
        held = 0.0
        for i in order:
            if (held + sizes[i]) / total <= 1.25 * val_fraction:
                is_val[i], held = True, held + sizes[i]
        if is_val.any() and held / total >= 0.5 * val_fraction:
            return docs, is_val
    parts: list[list[str]] = []
    for doc in docs:  # rule 3: every document's tail
        if len(doc) < 2:
            parts.append(doc)
            continue
        cut = len(doc) - max(1, round(val_fraction * len(doc)))
        parts += [doc[:cut], doc[cut:]]
    flags = [k % 2 == 1 for doc in docs for k in range(2 if len(doc) >= 2 else 1)]
    return parts, np.array(flags, dtype=bool)


def split_documents(docs: list[list[str]], encoded: list[list[int]], is_val: np.ndarray, eos: int | None
                    ) -> dict[str, Split]:
    """Route each document's encoded lines to the train or valid split; ``eos`` (if any) closes each document."""
    splits = {"train": Split([], [], []), "valid": Split([], [], [])}
    position = 0
    for d, doc in enumerate(docs):
        split = splits["valid" if is_val[d] else "train"]
        lines = encoded[position: position + len(doc)]
        if eos is not None:
            lines[-1] = np.append(lines[-1], np.asarray(eos, dtype=lines[-1].dtype))
        for ids in lines:
            split.tokens.append(np.asarray(ids))
            split.line_lengths.append(len(ids))
        split.doc_lines.append(len(doc))
        position += len(doc)
    return splits


def _encode_all(tokenizer, lines: list[str], workers: int | None, progress: bool,
                line_breaks: bool = True) -> list[list[int]]:
    workers = workers if workers is not None else min(os.cpu_count() or 1, 8)
    chunk = 2000
    chunks = [lines[i: i + chunk] for i in range(0, len(lines), chunk)]
    bar = tqdm(total=len(lines), desc="tokenizing", unit=" lines", disable=not progress, file=sys.stderr)
    out: list[list[int]] = []
    if workers <= 1 or len(chunks) == 1:
        for part in chunks:
            out.extend(encode_lines(tokenizer, part, line_breaks))
            bar.update(len(part))
    else:
        with pool(workers, _init_worker, (tokenizer, line_breaks)) as encoders:  # a stop terminates them
            for part, ids in zip(chunks, encoders.imap(_encode_chunk, chunks), strict=True):
                out.extend(ids)
                bar.update(len(part))
    bar.close()
    return out


# -- reading shards ---------------------------------------------------------------------------------
@dataclass
class TokenShard:
    """One split of a prepared corpus, memory-mapped: tokens, line offsets and document offsets."""

    tokens: np.ndarray  # (n_tokens,) uint16 / uint32, memory-mapped
    lines: np.ndarray  # (n_lines + 1,) int64
    docs: np.ndarray  # (n_docs + 1,) int64, offsets into lines
    manifest: dict

    @classmethod
    def open(cls, corpus_dir: str | Path, split: str = "train", tokenizer=None) -> TokenShard:
        root = Path(corpus_dir)
        manifest_path = root / MANIFEST
        if not manifest_path.is_file():
            raise LmforgeError(f"{root}: not a prepared corpus (no {MANIFEST}; run `lmforge data prepare`)")
        try:
            manifest = json.loads(manifest_path.read_text())
            dtype = np.dtype(manifest["dtype"])
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise LmforgeError(f"{manifest_path}: corrupt manifest ({err})") from None
        if tokenizer is not None and manifest.get("tokenizer_hash") != tokenizer_fingerprint(tokenizer):
            raise LmforgeError(f"{root}: prepared with another tokenizer (hash {manifest.get('tokenizer_hash')})")
        files = [f"{split}{ext}" for ext in SHARD_FILES if (root / f"{split}{ext}").exists()]
        verify_files(root, [MANIFEST, *files], lmforge_written=True)  # edited after preparation: refused
        path = root / f"{split}.tokens"
        size = path.stat().st_size // dtype.itemsize if path.exists() else 0
        tokens = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
        lines = np.load(root / f"{split}.lines.npy")
        docs = np.load(root / f"{split}.docs.npy")
        if lines[-1] != size:
            raise LmforgeError(f"{path}: holds {size} tokens but its line offsets end at {lines[-1]} (corrupt)")
        if size and int(tokens.max()) >= int(manifest.get("vocab_size", 0) or 2**32):
            raise LmforgeError(f"{path}: holds id {int(tokens.max())}, outside the vocabulary of "
                               f"{manifest['vocab_size']} it was prepared with (corrupt)")
        return cls(tokens, lines, docs, manifest)

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.size)

    @property
    def n_docs(self) -> int:
        return len(self.docs) - 1

    def doc_tokens(self, d: int) -> np.ndarray:
        """All token ids of document d, as int64."""
        return np.asarray(self.tokens[self.lines[self.docs[d]]: self.lines[self.docs[d + 1]]], dtype=np.int64)

    def doc_line_range(self, d: int) -> tuple[int, int]:
        return int(self.docs[d]), int(self.docs[d + 1])

    def line_tokens(self, i: int) -> np.ndarray:
        return np.asarray(self.tokens[self.lines[i]: self.lines[i + 1]], dtype=np.int64)
