"""The GGUF container, read by hand so that every size it declares is checked against the file's length first.

A GGUF file (little-endian) is a header, then the tensors' bytes::

    "GGUF", version u32 (2 or 3), tensor_count u64, kv_count u64
    kv_count times       key (u64 length + UTF-8 bytes), value type u32, value
    tensor_count times   name, n_dims u32 (at most 4), n_dims x u64 (fastest dimension first), type u32, offset u64
    zeros up to a multiple of general.alignment (32), then each tensor's bytes at its offset from there

A value is a scalar (u8 ... f64, bool), a string (u64 length + bytes) or an array (item type u32, u64 count,
items). Nothing is allocated from a declared size before the file is known to hold it: an array of 2^40 strings
needs at least 8 bytes each, so an 832-byte file declaring one is refused at once, naming the field, where the
``gguf`` package's GGUFReader loops over the count until memory runs out (docs/benchmarks.md has the time).
Tensors must lie inside the file and not overlap, so the values they dequantize to are bounded by the file's
size (at most 7.1 float32 bytes per byte, for Q4_0).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.errors import LmforgeError
from lmforge.interop.kquants import BYTES as K_TYPES
from lmforge.interop.kquants import dequantize_k

SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # struct codes
STRING, ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS
TENSOR_INFO_MIN = 8 + 4 + 4 + 8  # an empty name, no dimension, the type and the offset
KV_MIN = 8 + 4 + 1  # an empty key, the type and a one-byte value
HINT = "the file is damaged or not what it claims; download it again"

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")  # what lmforge dequantizes
BLOCK = 32  # weights per quantisation block (Q8_0, Q4_0, Q4_1)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it; ``shape`` as ggml writes it (fastest dimension first)."""

    name: str
    kind: str  # the ggml type's name: F32, Q4_1, ...
    shape: tuple[int, ...]
    start: int  # byte offset in the file
    n_bytes: int


@dataclass
class GGUFFile:
    """A GGUF file's metadata (Python values) and tensor descriptions; tensor bytes stay on disk until ``raw``."""

    path: Path
    size: int
    metadata: dict[str, Any]
    tensors: list[TensorInfo]
    data: np.ndarray = field(repr=False)  # the whole file, memory-mapped (uint8)
    mapping: mmap.mmap | None = field(default=None, repr=False)  # the map ``data`` views

    def raw(self, t: TensorInfo) -> np.ndarray:
        """The bytes of tensor ``t`` (a view of the mapped file: nothing is read until used)."""
        return np.asarray(self.data[t.start:t.start + t.n_bytes])

    def release(self, t: TensorInfo) -> None:
        """Drop the pages of tensor ``t`` from this process's resident memory once it has been read (they stay in
        the page cache; a later ``raw`` reads them again): a load then holds one tensor of the file at a time, not
        the whole file beside the model it becomes."""
        if self.mapping is not None and hasattr(mmap, "MADV_DONTNEED"):
            start = t.start // mmap.PAGESIZE * mmap.PAGESIZE
            self.mapping.madvise(mmap.MADV_DONTNEED, start, t.start + t.n_bytes - start)


class Cursor:
    """Reads the header front to back; every read first checks that the file holds the bytes it needs."""

    def __init__(self, data: np.ndarray, path: Path) -> None:
        self.data, self.path, self.size, self.pos = memoryview(data), path, len(data), 0  # a memoryview: slices
        # of it cost a tenth of a memmap's, which counts for a vocabulary of 49,152 strings and 48,900 merges

    def fail(self, what: str, problem: str) -> LmforgeError:
        return LmforgeError(f"{self.path}: {what}: {problem}; {HINT}")

    def need(self, n: int, what: str) -> int:
        """Claim ``n`` bytes at the current position; the position they start at."""
        if n > self.size - self.pos:
            raise self.fail(what, f"needs {n:,} bytes at byte {self.pos:,} but the file has {self.size:,}")
        self.pos += n
        return self.pos - n

    def scalar(self, code: str, what: str) -> Any:
        return struct.unpack_from("<" + code, self.data, self.need(struct.calcsize(code), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("Q", what)
        start = self.need(n, what)
        return str(self.data[start:start + n], "utf-8", "replace")

    def strings(self, count: int, what: str) -> list[str]:
        """``count`` strings one after the other: ``string`` in one loop (the same checks, inlined: 0.05 s
        instead of 0.4 s for SmolLM2's tokens and merges)."""
        data, size, pos, out = self.data, self.size, self.pos, []
        length = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if size - pos < 8:
                self.pos = pos
                self.need(8, what)  # raises, naming the position
            (n,) = length(data, pos)
            if n > size - pos - 8:
                self.pos = pos + 8
                self.need(n, what)
            out.append(str(data[pos + 8:pos + 8 + n], "utf-8", "replace"))
            pos += 8 + n
        self.pos = pos
        return out

    def count(self, what: str, least: int) -> int:
        """A u64 count of items of at least ``least`` bytes each, refused if the rest of the file cannot hold them."""
        n = self.scalar("Q", what)
        if n * least > self.size - self.pos:
            each = f"{least} byte{'s' if least > 1 else ''}"
            raise self.fail(what, f"declares {n:,} items (at least {each} each) but the file has "
                                  f"{self.size - self.pos:,} bytes left")
        return n

    def value(self, kind: int, what: str) -> Any:
        """One metadata value of type ``kind``: a number, bool, string, or a list of those."""
        if kind in SCALARS:
            return self.scalar(SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise self.fail(what, f"unknown value type {kind}")
        item = self.scalar("I", what)
        if item in SCALARS:
            dtype = np.dtype("<" + SCALARS[item])
            n = self.count(what, dtype.itemsize)
            return np.frombuffer(self.data, dtype, n, self.need(n * dtype.itemsize, what)).tolist()
        if item != STRING:
            raise self.fail(what, f"arrays of type {item} are not supported (numbers, bools or strings)")
        return self.strings(self.count(what, 8), what)


def read_header(path: Path) -> GGUFFile:
    """Metadata and tensor descriptions of a GGUF file, every count, length, shape and offset checked against the
    file's size before it is used; one line (naming the file and the field) for a file that lies."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        with path.open("rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (ValueError, OSError) as err:  # an empty file cannot be mapped
        raise LmforgeError(f"{path}: not a readable GGUF file ({err})") from None
    data = np.frombuffer(mapping, dtype=np.uint8)
    c = Cursor(data, path)
    if bytes(data[:4]) != b"GGUF":
        raise LmforgeError(f"{path}: not a readable GGUF file (no GGUF magic at byte 0)")
    c.need(4, "magic")
    version = c.scalar("I", "header version")
    if version & 0xFFFF == 0:
        raise c.fail("header version", "a big-endian GGUF file, which lmforge does not read")
    if version not in (2, 3):
        raise c.fail("header version", f"version {version} (lmforge reads 2 and 3)")
    n_tensors = c.scalar("Q", "header tensor_count")
    metadata: dict[str, Any] = {}
    for _ in range(c.count("header kv_count", KV_MIN)):
        key = c.string(f"metadata key {len(metadata)}")
        if key in metadata:
            raise c.fail(f"metadata {key}", "the key appears twice")
        metadata[key] = c.value(c.scalar("I", f"metadata {key}"), f"metadata {key}")
    if n_tensors * TENSOR_INFO_MIN > c.size - c.pos:
        raise c.fail("header tensor_count", f"declares {n_tensors:,} tensors but the file has {c.size - c.pos:,} "
                                            "bytes left for their descriptions")
    infos = [tensor_info(c, GGMLQuantizationType) for _ in range(n_tensors)]
    align = metadata.get("general.alignment", 32)
    if not isinstance(align, int) or align < 1 or align & (align - 1):
        raise c.fail("metadata general.alignment", f"{align!r} is not a power of two")
    tensors = place_tensors(c, infos, -(-c.pos // align) * align, GGML_QUANT_SIZES)
    return GGUFFile(path, c.size, metadata, tensors, data, mapping)


def tensor_info(c: Cursor, types: Any) -> tuple[str, Any, tuple[int, ...], int]:
    """One tensor description: (name, ggml type, shape fastest-first, offset from the data section)."""
    name = c.string(f"tensor description at byte {c.pos:,}")
    n_dims = c.scalar("I", f"tensor {name}: n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name}: n_dims", f"{n_dims} dimensions (ggml has 1 to {MAX_DIMS})")
    shape = struct.unpack_from(f"<{n_dims}Q", c.data, c.need(8 * n_dims, f"tensor {name}: dims"))
    kind = c.scalar("I", f"tensor {name}: type")
    try:
        kind = types(kind)
    except ValueError:
        raise c.fail(f"tensor {name}: type", f"unknown ggml type {kind}") from None
    return name, kind, shape, c.scalar("Q", f"tensor {name}: offset")


def place_tensors(c: Cursor, infos: list[tuple[str, Any, tuple[int, ...], int]], data_start: int,
                  sizes: dict[Any, tuple[int, int]]) -> list[TensorInfo]:
    """Each tensor's bytes from its shape and type (Python integers: no overflow), inside the file, no two
    overlapping: what the tensors dequantize to is bounded by the file's size."""
    tensors, names = [], set()
    for name, kind, shape, offset in infos:
        what = f"tensor {name}"
        if name in names:
            raise c.fail(what, "the name appears twice")
        names.add(name)
        block, block_bytes = sizes[kind]
        if 0 in shape or shape[0] % block:
            raise c.fail(what, f"shape {list(shape)} (a zero dimension, or rows not in whole blocks of {block})")
        n_bytes = math.prod(shape) // block * block_bytes
        start = data_start + offset
        if start + n_bytes > c.size:
            raise c.fail(what, f"truncated or lying: {kind.name} {list(shape)} needs {n_bytes:,} bytes from byte "
                               f"{start:,} but the file has {c.size:,}")
        tensors.append(TensorInfo(name, kind.name, tuple(shape), start, n_bytes))
    ordered = sorted(tensors, key=lambda t: t.start)
    for a, b in pairwise(ordered):
        if b.start < a.start + a.n_bytes:
            raise c.fail(f"tensor {b.name}", f"its bytes overlap those of tensor {a.name}")
    return tensors


# -- dequantization: the block formats, written out ----------------------------------------------------
def dequantize(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes of one tensor -> float32 values of ``shape`` (rows, row length).

    Q8_0  per block: scale d (f16), 32 int8 q                         x = d q
    Q4_0  per block: d (f16), 32 4-bit q (low nibbles first)          x = d (q - 8)
    Q4_1  per block: d (f16), offset m (f16), 32 4-bit q              x = d q + m
    Q4_K, Q5_K, Q6_K: 256 weights a block, in sub-blocks with quantized scales (``kquants``)

    >>> block = np.frombuffer(np.float16(0.5).tobytes() + bytes(range(1, 33)), dtype=np.uint8)
    >>> dequantize(block, "Q8_0", (1, 32))[0, :4].tolist()
    [0.5, 1.0, 1.5, 2.0]
    """
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    if kind == "F32":
        return raw.view(np.float32).reshape(shape).copy()
    if kind == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if kind == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    if kind in K_TYPES:
        return dequantize_k(raw, kind, shape)
    if kind == "Q8_0":
        blocks = raw.reshape(-1, 2 + BLOCK)  # (n_blocks, bytes): scale d (f16), 32 int8
        d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
        w = blocks[:, 2:].view(np.int8).astype(np.float32)  # (n_blocks, 32); in place: one float32 copy at a time
        w *= d
        return w.reshape(shape)
    q, d, m = int4_blocks(raw, kind, shape)  # (rows, K), (rows, K / 32) twice
    w = q.reshape(*d.shape, BLOCK).astype(np.float32)  # (rows, K / 32, 32); in place below, the same roundings
    if kind == "Q4_0":  # d (q - 8)
        w -= 8
        w *= d[..., None]
    else:  # d q + m
        w *= d[..., None]
        w += m[..., None]
    return w.reshape(shape)


def int8_blocks(raw: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 bytes -> (q int8 (rows, K / 32, 32), d float32 (rows, K / 32)), x = d q: the integers as stored, q a
    view of ``raw`` (no copy: its one copy is the layer's own layout, ``nn.kernels.pack_int8``).

    >>> block = np.frombuffer(np.float16(0.5).tobytes() + bytes(range(1, 33)), dtype=np.uint8)
    >>> q, d = int8_blocks(block, (1, 32))
    >>> q[0, 0, :3].tolist(), d.tolist()
    ([1, 2, 3], [[0.5]])
    """
    blocks = np.ascontiguousarray(raw).reshape(-1).view(np.uint8).reshape(-1, 2 + BLOCK)  # (n_blocks, bytes)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    rows = math.prod(shape[:-1])
    return blocks[:, 2:].view(np.int8).reshape(rows, -1, BLOCK), d.reshape(rows, -1)


def int4_blocks(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_0 / Q4_1 / Q4_K bytes -> (q uint8 (rows, K) in [0, 15], d float32 (rows, K / 32), m float32 (rows,
    K / 32)), x = d (q - 8) for Q4_0 (m = 0 here) and x = d q + m for Q4_1 and Q4_K (whose d and m are its
    sub-block's products d s_j and -dmin m_j): the integers as stored, nothing dequantized.

    >>> block = np.frombuffer(np.float16(0.5).tobytes() + bytes([0x21] + [0] * 15), dtype=np.uint8)
    >>> q, d, m = int4_blocks(block, "Q4_0", (1, 32))
    >>> q[0, [0, 16]].tolist(), d.tolist()
    ([1, 2], [[0.5]])
    """
    if kind == "Q4_K":  # 8 sub-blocks of 32 a block of 256: kquants.py
        from lmforge.interop.kquants import q4_k_int4

        return q4_k_int4(raw, (math.prod(shape[:-1]), shape[-1]))
    raw = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    head = {"Q4_0": 2, "Q4_1": 4}[kind]  # bytes of scale (and offset) per block
    blocks = raw.reshape(-1, head + BLOCK // 2)  # (n_blocks, bytes)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)[:, 0]  # (n_blocks,)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0] if kind == "Q4_1" else np.zeros_like(d)
    packed = blocks[:, head:]  # (n_blocks, 16): value j in the low nibble of byte j, value 16 + j in the high
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1)  # (n_blocks, 32)
    rows = math.prod(shape[:-1])
    return q.reshape(shape), d.reshape(rows, -1), m.reshape(rows, -1)
