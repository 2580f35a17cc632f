"""GGUF files that lie about their sizes (interop/gguf_file.py, gguf.py's checks): each one line naming the file and
the field, no traceback, within 2 GB of address space and before anything the lie describes is allocated.

The header lies are written by hand (the gguf package's writer would not write them); the metadata lies are real
files from ``write_gguf`` whose config disagrees with their tensors. All are loaded in one child process under
``RLIMIT_AS`` = 2 GB and a deadline, so a regression fails (MemoryError, a torch allocation error, a timeout)
instead of swapping the machine.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys

import pytest

from lmforge.interop.gguf_write import write_gguf
from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder

pytest.importorskip("gguf", reason="the gguf package (lmforge[gguf], in the dev extra) reads GGUF files")

U8, U32, F32, STRING, ARRAY = 0, 4, 6, 8, 9


def text(value: str | bytes) -> bytes:
    """A GGUF string: u64 length, then the bytes."""
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, kind: int, payload: bytes) -> bytes:
    return text(key) + struct.pack("<I", kind) + payload


def tensor(name: str, dims: list[int], offset: int = 0, n_dims: int | None = None) -> bytes:
    """A tensor description: name, n_dims, dims (fastest first), type F32 (0), offset."""
    n = len(dims) if n_dims is None else n_dims
    return text(name) + struct.pack(f"<I{len(dims)}QIQ", n, *dims, 0, offset)


def gguf_bytes(kvs: list[bytes], tensors: list[bytes], data: bytes = bytes(64), counts: tuple | None = None) -> bytes:
    """Header (magic, version 3, counts), metadata, tensor descriptions, padding to 32, data."""
    n_tensors, n_kv = counts or (len(tensors), len(kvs))
    head = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"".join(kvs) + b"".join(tensors)
    return head + bytes(-len(head) % 32) + data


LLAMA = [kv("general.architecture", STRING, text("llama"))] + [
    kv(f"llama.{key}", U32, struct.pack("<I", value)) for key, value in
    (("block_count", 1), ("embedding_length", 4), ("feed_forward_length", 8), ("attention.head_count", 2),
     ("vocab_size", 4))] + [kv("llama.attention.layer_norm_rms_epsilon", F32, struct.pack("<f", 1e-5))]

HEADER_LIES = {  # file -> (bytes, what the one line must name)
    "dims": (gguf_bytes(LLAMA, [tensor("token_embd.weight", [2, 10**10])]),
             r"tensor token_embd\.weight: truncated or lying: F32 \[2, 10000000000\] needs 80,000,000,000 bytes"),
    "overflowing_dims": (gguf_bytes(LLAMA, [tensor("token_embd.weight", [2**62 + 1, 4])]),  # numpy's u64 product: 4
                         r"tensor token_embd\.weight: truncated or lying"),
    "n_dims": (gguf_bytes(LLAMA, [tensor("token_embd.weight", [4, 4], n_dims=2**31)]),
               r"tensor token_embd\.weight: n_dims: 2147483648 dimensions"),
    "offset": (gguf_bytes(LLAMA, [tensor("token_embd.weight", [4, 4], offset=2**63)]),
               r"tensor token_embd\.weight: truncated or lying: .* from byte 9,223,372,036,854,776,"),
    "overlap": (gguf_bytes(LLAMA, [tensor("token_embd.weight", [4, 4]), tensor("output_norm.weight", [4], 32)]),
                r"tensor output_norm\.weight: its bytes overlap those of tensor token_embd\.weight"),
    "strings": (gguf_bytes([*LLAMA, kv("tokenizer.ggml.tokens", ARRAY, struct.pack("<IQ", STRING, 2**40))], []),
                r"metadata tokenizer\.ggml\.tokens: declares 1,099,511,627,776 items \(at least 8 bytes each\)"),
    "bytes": (gguf_bytes([*LLAMA, kv("tokenizer.ggml.token_type", ARRAY, struct.pack("<IQ", U8, 2**40))], []),
              r"metadata tokenizer\.ggml\.token_type: declares 1,099,511,627,776 items \(at least 1 byte each\)"),
    "string": (gguf_bytes([*LLAMA, kv("general.name", STRING, struct.pack("<Q", 2**60))], []),
               r"metadata general\.name: needs 1,152,921,504,606,846,976 bytes"),
    "tensor_count": (gguf_bytes(LLAMA, [], counts=(2**60, len(LLAMA))), r"header tensor_count: declares"),
    "kv_count": (gguf_bytes(LLAMA, [], counts=(0, 2**60)), r"header kv_count: declares"),
}

METADATA_LIES = {  # file -> (config change, what the one line must name)
    "vocab": ({"vocab_size": 10**9}, r"tensor token_embd\.weight has shape \(300, 64\) but the metadata .* "
                                     r"describes \(1000000000, 64\)"),
    "layers": ({"num_hidden_layers": 10**6}, r"metadata llama\.block_count = 1,000,000 needs 9 tensors a layer"),
    "width": ({"hidden_size": 2**20}, r"tensor token_embd\.weight has shape \(300, 64\) but the metadata"),
    "ffn": ({"intermediate_size": 10**7}, r"tensor blk\.0\.ffn_gate\.weight has shape \(96, 64\) but the metadata"),
    "context": ({"max_position_embeddings": 10**9}, r"metadata llama\.context_length = 1,000,000,000 would need"),
}

CHILD = """
import json, resource, sys, traceback
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
import lmforge
from lmforge.errors import LmforgeError
for path in sys.argv[1:]:
    try:
        lmforge.load(path)
        print(json.dumps({"path": path, "error": None}), flush=True)
    except LmforgeError as err:
        print(json.dumps({"path": path, "error": "LmforgeError", "message": str(err)}), flush=True)
    except BaseException as err:
        print(json.dumps({"path": path, "error": type(err).__name__, "message": traceback.format_exc()}), flush=True)
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> dict[str, dict]:
    """Every lying file loaded by ``lmforge.load`` in one child process (2 GB of address space, 5 minutes)."""
    from test_gguf import byte_tokenizer, tiny_llama

    folder = tmp_path_factory.mktemp("lies")
    paths = []
    for name, (raw, _) in HEADER_LIES.items():
        (folder / f"{name}.gguf").write_bytes(raw)
        paths.append(folder / f"{name}.gguf")
    model, tok = tiny_llama(), byte_tokenizer()
    config, state = llama_config_from_decoder(model.config), llama_state_from_decoder(model.state_dict(), model.config)
    for name, (change, _) in METADATA_LIES.items():
        paths.append(write_gguf(folder / f"{name}.gguf", {**config, **change}, state, tok, dtype="f32"))
    answers = {}
    while paths:  # a child that dies answers for the files before; the file it died on is recorded, the rest go on
        run = subprocess.run([sys.executable, "-c", CHILD, *map(str, paths)], capture_output=True, text=True,
                             timeout=300)
        for line in map(json.loads, run.stdout.splitlines()):
            answers[line["path"]] = line
        paths = [p for p in paths if str(p) not in answers]
        if paths:
            answers[str(paths.pop(0))] = {"error": f"child died (rc {run.returncode})", "message": run.stderr[-1500:]}
    return {path.rsplit("/", 1)[1].removesuffix(".gguf"): line for path, line in answers.items()}


@pytest.mark.parametrize("name", [*HEADER_LIES, *METADATA_LIES])
def test_a_lying_gguf_is_one_line_naming_the_file_and_the_field(answers, name):
    answer = answers[name]
    expected = (HEADER_LIES.get(name) or METADATA_LIES[name])[1]
    assert answer["error"] == "LmforgeError", answer.get("message")
    assert "\n" not in answer["message"] and f"{name}.gguf: " in answer["message"]
    assert re.search(expected, answer["message"]), answer["message"]


def test_the_header_reader_keeps_what_the_gguf_package_reads(tmp_path):
    """Metadata of every value type, and tensor bytes, read by hand equal GGUFReader's on a file it writes."""
    import gguf
    import numpy as np

    from lmforge.interop.gguf_file import read_header

    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    w.add_uint8("a.u8", 7), w.add_int32("a.i32", -5), w.add_float32("a.f32", 0.1), w.add_bool("a.bool", True)
    w.add_uint64("a.u64", 2**40), w.add_float64("a.f64", 1e-300), w.add_string("a.str", "héllo")
    w.add_array("a.strs", ["x", "", "日本"]), w.add_array("a.ints", [1, 2, 3]), w.add_array("a.floats", [0.5, 1.5])
    values = np.arange(96, dtype=np.float32).reshape(3, 32)
    w.add_tensor("t", values), w.add_tensor("q", gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0),
                                            raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    ours, theirs = read_header(tmp_path / "x.gguf"), gguf.GGUFReader(tmp_path / "x.gguf")
    for key, field in theirs.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents(), key
    assert [(t.name, t.kind, t.shape, t.start, t.n_bytes) for t in ours.tensors] == \
        [(t.name, t.tensor_type.name, tuple(t.shape.tolist()), t.data_offset, t.n_bytes) for t in theirs.tensors]
    assert all(np.array_equal(ours.raw(a), np.asarray(b.data).reshape(-1).view(np.uint8))
               for a, b in zip(ours.tensors, theirs.tensors, strict=True))
