"""GGUF read: llama.cpp's one-file format (metadata + tensors); written by ``gguf_write.py`` (the ``gguf`` package).

A GGUF file holds what a Hugging Face folder spreads over config.json, tokenizer.json and the weights:

    metadata   llama.block_count = 30, llama.attention.head_count_kv = 3, tokenizer.ggml.tokens = [...],
               tokenizer.ggml.merges = [...], tokenizer.chat_template = "{% for message in messages %}..."
    tensors    blk.0.attn_q.weight  Q4_1  [576, 576]   (shapes as ggml writes them: fastest dimension first)

Reading gives Hugging Face Llama names and layout (``interop/llama.py`` maps those to the one Decoder):

    token_embd -> model.embed_tokens     blk.i.attn_q/k/v/output -> model.layers.i.self_attn.q/k/v/o_proj
    output_norm -> model.norm            blk.i.ffn_gate/up/down -> model.layers.i.mlp.gate/up/down_proj
    output -> lm_head                    blk.i.attn_norm, ffn_norm -> input_layernorm, post_attention_layernorm

Two things to undo. (1) Quantisation: blocks of 32 weights share a scale (and an offset), dequantized here to
float32 (``gguf_file.dequantize``), or, asked for int4 layers (``load_gguf(dtype="int4")``, ``--dtype int4``), Q4_0
and Q4_1 matrices kept as their integers: a block is an int4 group of 32 (``Int4Rows``, ``nn.quant``).
(2) llama.cpp's converter permutes the rows of W_q and W_k: within each head it interleaves the two halves
(rows [0, d/2) and [d/2, d)) so that its rotary code can rotate adjacent pairs; HF's and lmforge's rotate half
against half, so the rows go back (``unpermute``; ``permute`` for ``gguf_write``).

A GGUF file carries no checksum: it is checked by its own sizes and loads as unverified. Nothing is allocated
from a size it declares before that size is checked: the header against the file's length (``gguf_file``), the
tensors' shapes against the metadata (``check_shapes``), the rotary tables against the weights; a file that lies
is one line naming the file and the field.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.cores import fitting_threads, machine
from lmforge.errors import LmforgeError
from lmforge.interop.gguf_file import BLOCK, TYPES, GGUFFile, dequantize, int4_blocks, int8_blocks, read_header
from lmforge.models.unwritten import return_freed_memory, unwritten

LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
TOKEN_TYPES = {"normal": 1, "unknown": 2, "control": 3, "user_defined": 4, "unused": 5, "byte": 6}


def gguf_module():
    try:
        import gguf
    except ImportError:
        raise LmforgeError("reading GGUF files needs the gguf package: pip install 'lmforge[gguf]'") from None
    return gguf


# -- the rotary row order -------------------------------------------------------------------------------------
def unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's rotary row order -> Hugging Face's: per head, rows (0, d/2, 1, d/2 + 1, ...) -> (0, 1, ..., d-1).

    >>> unpermute(np.array([0, 2, 1, 3]).reshape(4, 1), heads=1).ravel().tolist()
    [0, 1, 2, 3]
    """
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of ``unpermute``: Hugging Face's rows -> llama.cpp's interleaved halves.

    >>> permute(np.arange(4).reshape(4, 1), heads=1).ravel().tolist()
    [0, 2, 1, 3]
    """
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# -- reading --------------------------------------------------------------------------------------------------
INT4_TYPES = ("Q4_0", "Q4_1", "Q4_K")  # blocks that are int4 groups of 32 as they stand (Q4_K: its sub-blocks)


@dataclass
class Int4Rows:
    """A Q4_0 / Q4_1 matrix kept as integers: W = s (q - 8) + z per group of 32 (Q4_0: s = d, z = 0; Q4_1:
    s = d, z = m + 8 d). q (N, K) uint8, s and z (N, K / 32) float32, rows in each: reordering the rows
    (``unpermute``, on each) and stacking them (``stack``) is all the Llama mapping does to a matrix."""

    q: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.q.shape)

    @staticmethod
    def stack(parts: list[Int4Rows]) -> Int4Rows:
        """The rows of ``parts`` one after the other (as ``torch.cat(dim=0)``)."""
        return Int4Rows(*(torch.cat([getattr(p, f) for p in parts]) for f in ("q", "scales", "zeros")))

    def dequantized(self) -> torch.Tensor:
        """W (N, K) float32, for a matrix stacked with a float one (a file mixing types)."""
        n, k = self.shape
        q = self.q.reshape(n, k // BLOCK, BLOCK).float() - 8
        return (q * self.scales[..., None] + self.zeros[..., None]).reshape(n, k)

    def layer(self) -> torch.nn.Module:
        """The int4 layer of these integers (group 32); scales and zeros become bfloat16, the kernel's."""
        from lmforge.nn.quant import QuantizedLinear

        return QuantizedLinear.int4(self.q, self.scales, self.zeros, group=BLOCK)


@dataclass
class Int8Rows:
    """A Q8_0 embedding kept as integers, W = d q per block of 32: the tied head's int8 layer, whose rows the
    embedding's lookups read (``nn.quant.QuantizedEmbedding``), never a float32 matrix. q (V, D / 32, 32) int8,
    d (V, D / 32) float32."""

    q: torch.Tensor  # (V, D / 32, 32): a view of the file's blocks
    scales: torch.Tensor
    release: Callable[[], None]  # the file's pages of these blocks, given back

    def layer(self) -> torch.nn.Module:
        """The int8 layer of these integers (group 32); d becomes bfloat16, the kernels' (a weight moves by at
        most 2^-8 of itself)."""
        from lmforge.nn.quant import QuantizedLinear

        layer = QuantizedLinear.int8(self.q, self.scales)
        self.release()
        return layer


@dataclass
class GGUFModel:
    """What a GGUF file describes: the architecture, a Hugging Face Llama config, the tokenizer's metadata, the
    chat template, and the tensors (read and dequantized on ``tensors()``)."""

    path: Path
    architecture: str
    hf_config: dict[str, Any]
    metadata: dict[str, Any] = field(repr=False)
    file: GGUFFile = field(repr=False)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def tensors(self, keep: str | None = None) -> TensorReader:
        """Every tensor by its Hugging Face Llama name, read (dequantized to float32, W_q and W_k rows back in HF
        order) when looked up, so that a loader holds one tensor's temporaries at a time, not a second model; types
        and shapes are checked against the config before any is read. ``keep="int4"``: Q4_0 / Q4_1 matrices kept
        as ``Int4Rows`` (their integers, no float32 copy); ``"int4"`` or ``"int8"``: a tied Q8_0 embedding kept as
        ``Int8Rows`` (the int8 head either makes of it)."""
        for t in self.file.tensors:
            if t.kind not in TYPES:
                raise LmforgeError(f"{self.path}: tensor {t.name} is of type {t.kind}; lmforge reads "
                                   f"{', '.join(TYPES)}")
        check_shapes(self)
        return TensorReader(self, keep)


class TensorReader(Mapping):
    """A GGUF file's tensors by Hugging Face name (``GGUFModel.tensors``): each read from the mapped file when
    looked up, never kept (look each up once)."""

    def __init__(self, model: GGUFModel, keep: str | None) -> None:
        self.model, self.int4, self.int8 = model, keep == "int4", keep in ("int4", "int8")
        self.infos = {hf_name(t.name, model.path): t for t in model.file.tensors}

    def __len__(self) -> int:
        return len(self.infos)

    def __iter__(self) -> Iterator[str]:
        return iter(self.infos)

    def __getitem__(self, name: str) -> torch.Tensor | Int4Rows | Int8Rows:
        t, c = self.infos[name], self.model.hf_config
        shape = tuple(reversed(t.shape))  # ggml: fastest dimension first
        raw = self.model.file.raw(t)
        if self.int8 and kept_int8(name, t.kind, c):  # its pages are released once the layer has its copy
            q, d = int8_blocks(raw, shape)
            with warnings.catch_warnings():  # a view of the read-only map, only ever read
                warnings.simplefilter("ignore", UserWarning)
                return Int8Rows(torch.from_numpy(q), torch.from_numpy(d), lambda: self.model.file.release(t))
        parts = int4_blocks(raw, t.kind, shape) if self.int4 and kept_int4(name, t.kind, shape) else \
            (dequantize(raw, t.kind, shape),)  # new arrays either way: the file's pages can go
        self.model.file.release(t)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = c["num_attention_heads"] if name.endswith("q_proj.weight") else c["num_key_value_heads"]
            parts = tuple(unpermute(p, heads) for p in parts)
        tensors = [torch.from_numpy(np.ascontiguousarray(p)) for p in parts]
        if len(tensors) == 1:
            return tensors[0]
        q, d, m = tensors  # (q, d, m) -> s = d, z = m + 8 d
        return Int4Rows(q, d, m + 8 * d if t.kind != "Q4_0" else m)  # Q4_1, Q4_K: x = d q + m


def kept_int8(name: str, kind: str, hf_config: dict[str, Any]) -> bool:
    """Whether a tensor becomes an int8 layer as stored: a tied model's Q8_0 embedding (its head: what
    ``quantize`` makes of it anyway, int8 in groups of 32, and its lookups read the head's rows)."""
    return kind == "Q8_0" and name == "model.embed_tokens.weight" and bool(hf_config.get("tie_word_embeddings"))


def kept_int4(name: str, kind: str, shape: tuple[int, ...]) -> bool:
    """Whether a tensor becomes an int4 layer as stored: a Q4_0 / Q4_1 / Q4_K matrix of a linear layer (not the
    embedding, a lookup) of a shape the int4 kernel holds (rows a multiple of 16)."""
    from lmforge.nn.quant import unsupported

    return kind in INT4_TYPES and name != "model.embed_tokens.weight" and len(shape) == 2 and \
        unsupported(shape[0], shape[1], "int4", BLOCK) is None


def hf_name(name: str, path: Path) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    raise LmforgeError(f"{path}: tensor {name} is not part of a Llama model lmforge knows")


def llama_shapes(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor of the Llama model ``c`` describes, by Hugging Face name (rows, columns).

    >>> shapes = llama_shapes({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 1,
    ...     "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": True})
    >>> len(shapes), shapes["model.layers.0.self_attn.k_proj.weight"], shapes["model.layers.0.mlp.down_proj.weight"]
    (11, (4, 8), (8, 12))
    """
    d, ff, vocab = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    q, kv = d // c["num_attention_heads"] * c["num_attention_heads"], d // c["num_attention_heads"] * \
        c["num_key_value_heads"]
    layer = {"input_layernorm": (d,), "post_attention_layernorm": (d,), "self_attn.q_proj": (q, d),
             "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d), "self_attn.o_proj": (d, q),
             "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff)}
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,)}
    if not c["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, d)
    for i in range(c["num_hidden_layers"]):
        shapes.update({f"model.layers.{i}.{part}.weight": shape for part, shape in layer.items()})
    return shapes


def check_shapes(model: GGUFModel) -> None:
    """The tensors the file holds are exactly those its metadata describes, shape for shape: checked before
    anything is dequantized or built, so metadata declaring a 10^9-token vocabulary over a tiny tensor (or
    1,000 layers over 2) is one line, not a 256 GB allocation."""
    c, path = model.hf_config, model.path
    declared = {hf_name(t.name, path): t for t in model.file.tensors}
    layers = c["num_hidden_layers"]
    if len(LAYER_NAMES) * layers > len(declared):
        raise LmforgeError(f"{path}: metadata llama.block_count = {layers:,} needs {len(LAYER_NAMES)} tensors a "
                           f"layer but the file holds {len(declared)} tensors; {METADATA_HINT}")
    expected = llama_shapes(c)
    for name, t in declared.items():
        shape = tuple(reversed(t.shape))
        if name not in expected:
            raise LmforgeError(f"{path}: tensor {t.name} is not part of the model the metadata describes "
                               f"(llama.block_count = {layers}); {METADATA_HINT}")
        if shape != expected[name]:
            raise LmforgeError(f"{path}: tensor {t.name} has shape {shape} but the metadata (llama.vocab_size, "
                               f"embedding_length, ...) describes {expected[name]}; {METADATA_HINT}")
    missing = [name for name in expected if name not in declared]
    if missing:
        raise LmforgeError(f"{path}: missing tensor(s) {', '.join(missing[:3])}"
                           f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}; {METADATA_HINT}")


METADATA_HINT = "the metadata and the tensors disagree (a damaged or crafted file)"


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """The metadata of a GGUF file (tensors stay on disk until ``tensors()``); one line for a file whose header
    declares more than the file holds (``gguf_file.read_header``) or that is not a Llama-family GGUF."""
    gguf_module()
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"{path}: no such GGUF file")
    file = read_header(path)
    arch = file.metadata.get("general.architecture")
    if arch != "llama":
        raise LmforgeError(f"{path}: architecture {arch!r} is not supported (lmforge reads Llama-family GGUF "
                           "files: general.architecture = llama)")
    return GGUFModel(path, arch, llama_config(file, path), file.metadata, file)


def metadata_value(m: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path, default: Any = None,
                   least: int | None = None) -> Any:
    """``m[key]`` if it is of ``kind`` (and at least ``least``), ``default`` if absent; one line otherwise."""
    value = m.get(key, default)
    if value is None:
        raise LmforgeError(f"{path}: metadata {key} is missing")
    if isinstance(value, bool) or not isinstance(value, kind) or (least is not None and value < least):
        raise LmforgeError(f"{path}: metadata {key} is {value!r:.40}, not a {getattr(kind, '__name__', 'number')}"
                           f"{f' of at least {least}' if least is not None else ''}")
    return value


def llama_config(file: GGUFFile, path: Path) -> dict[str, Any]:
    """The Hugging Face LlamaConfig (as a dict) that the metadata describes, each value of the right type."""
    m = file.metadata

    def count(key: str, default: Any = None) -> int:
        return metadata_value(m, key, int, path, default, least=1)

    def number(key: str, default: Any = None) -> float:
        return metadata_value(m, key, (int, float), path, default)

    heads = count("llama.attention.head_count")
    vocab = count("llama.vocab_size") if "llama.vocab_size" in m else \
        len(metadata_value(m, "tokenizer.ggml.tokens", list, path))
    untied = any(t.name == "output.weight" for t in file.tensors)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": count("llama.embedding_length"), "intermediate_size": count("llama.feed_forward_length"),
            "num_hidden_layers": count("llama.block_count"), "num_attention_heads": heads,
            "num_key_value_heads": count("llama.attention.head_count_kv", heads),
            "rms_norm_eps": number("llama.attention.layer_norm_rms_epsilon"),
            "rope_theta": number("llama.rope.freq_base", 10000.0),
            "max_position_embeddings": count("llama.context_length", 2048), "tie_word_embeddings": not untied,
            "bos_token_id": m.get("tokenizer.ggml.bos_token_id"), "eos_token_id": m.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": m.get("tokenizer.ggml.padding_token_id"), "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False}


def gguf_tokenizer(model: GGUFModel):
    """The tokenizer a GGUF's metadata describes, as ``transformers`` builds it from the same file: GPT-2 style
    byte-level BPE (tokens, merges, GPT-2's split), the control tokens special (split out of text), the
    bos / eos / unk / pad ids from the file."""
    from lmforge.tokenizers import from_huggingface

    m, path = model.metadata, model.path
    if m.get("tokenizer.ggml.model") != "gpt2":
        raise LmforgeError(f"{path}: tokenizer model {m.get('tokenizer.ggml.model')!r:.40} is not supported "
                           "(lmforge reads byte-level BPE: tokenizer.ggml.model = gpt2)")
    tokens = metadata_value(m, "tokenizer.ggml.tokens", list, path)
    types = metadata_value(m, "tokenizer.ggml.token_type", list, path, [])
    merges = metadata_value(m, "tokenizer.ggml.merges", list, path, [])
    for key, values, kind in (("tokens", tokens, str), ("token_type", types, int), ("merges", merges, str)):
        if not all(isinstance(v, kind) for v in values):
            raise LmforgeError(f"{path}: metadata tokenizer.ggml.{key} holds values that are not {kind.__name__}s")
    metadata_value(m, "tokenizer.chat_template", str, path, "")
    control = [{"id": i, "content": t, "special": True} for i, (t, kind) in enumerate(zip(tokens, types, strict=False))
               if kind == TOKEN_TYPES["control"]]
    data = {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
            "added_tokens": control, "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}
    tok = from_huggingface(data, str(path))
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        index = m.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            tok.set_role(role, tokens[index])
    return tok


def check_position_tables(config: Any, model: GGUFModel) -> None:
    """The Decoder's rotary tables (llama.context_length rows, not stored in the file) must not outweigh the
    weights and 1 GiB. Sized from two small Decoders (one layer, a one-token vocabulary, 1 and 2 positions: the
    tables grow by one row a position), built for real: building the whole one on the meta device would allocate
    nothing too, but torch computes the tables there through its Python decompositions, which import
    torch._dynamo (0.9 s of every load)."""
    import dataclasses

    from lmforge.models.decoder import Decoder

    def table_bytes(positions: int) -> int:
        small = dataclasses.replace(config, n_layers=1, vocab_size=1, max_positions=positions, bos_id=None,
                                    eos_id=None, pad_id=None)
        with unwritten():
            probe = Decoder(small)
        return sum(b.nelement() * b.element_size() for b in probe.buffers())

    path = model.path
    try:
        first, second = table_bytes(1), table_bytes(2)
    except ValueError as err:  # a shape the modules refuse (an odd rotary head width)
        raise LmforgeError(f"{path}: {err}") from None
    tables = first + (config.max_positions - 1) * (second - first)
    weights = 4 * sum(math.prod(shape) for shape in llama_shapes(model.hf_config).values())  # float32
    if tables > max(weights, 1 << 30):
        raise LmforgeError(f"{path}: metadata llama.context_length = {config.max_positions:,} would need "
                           f"{tables / 1e9:,.1f} GB of rotary tables, more than the weights ({weights / 1e9:.2f} GB) "
                           "and 1 GiB; a damaged or crafted file")


def load_gguf(path: str | os.PathLike, dtype: str | None = None, group: int = 32,
              tokenizer: bool = True) -> tuple[torch.nn.Module, Any]:
    """(lmforge Decoder in eval mode, tokenizer with the file's chat template, or None with ``tokenizer=False``:
    SmolLM2's 49,152 tokens and 48,900 merges are ~30 MiB of Python objects, a third of its int4 weights) from a
    Llama-family GGUF file.

    Nothing is allocated from a size the file declares before it is checked: the header against the file's
    length (``read_header``), the tensors against the metadata (``check_shapes``), the position tables against
    the weights; only then are the tensors dequantized, one at a time, and become the Decoder's parameters (built
    ``unwritten``: no initialisation, no copy; models/unwritten.py).

    ``dtype`` int8 / int4 (``group``: the quantization's group): each linear layer's matrix becomes its quantized
    layer as it is read, so that no float32 model ever exists (``nn.quant.quantized_layer``: the layers
    ``quantize`` would make of the float32 model, bit for bit; the tied head is left to it, from the embedding).
    With group 32, what the file already holds in that form is kept as stored: with int4, the Q4_0 / Q4_1 / Q4_K
    matrices become int4 layers from their own integers, never dequantized; with int4 or int8, a tied Q8_0
    embedding becomes the head's int8 layer, whose rows the embedding's lookups read."""
    from lmforge.interop.llama import decoder_config_from_llama, decoder_state_from_llama
    from lmforge.models.decoder import Decoder
    from lmforge.models.registry import load_weights
    from lmforge.nn.quant import QuantizedEmbedding, match_activations, quantized_layer

    machine()  # the first look at the other processes' load: the conversion below asks, after the vocabulary
    model = read_gguf(path)
    config = decoder_config_from_llama(model.hf_config, str(model.path))
    tok = gguf_tokenizer(model) if tokenizer else None
    tokens = tok.vocab_size if tok else len(metadata_value(model.metadata, "tokenizer.ggml.tokens", list,
                                                          model.path, []))
    if tokens > config.vocab_size:
        raise LmforgeError(f"{model.path}: the tokenizer has {tokens} tokens but the model only "
                           f"{config.vocab_size} embeddings")
    if tok:
        tok.chat_template = model.chat_template
    check_shapes(model)  # before the probe: building 10^6 layers, even on the meta device, exhausts memory
    check_position_tables(config, model)
    streamed = dtype in ("int8", "int4") and not config.bias  # a layer's bias is a tensor of its own: left whole

    def convert(name: str, value: Any) -> Any:
        """A block type's integers as their layer, a float matrix of a linear layer as its quantized layer; the
        heap the repacking freed handed back after each block's last (without it the freed blocks of 30 layers'
        temporaries stay resident: SmolLM2 int4's peak 1.44x its file, not 1.3x; after every matrix, the
        trimming and the faults of the pages taken again cost int8's load 0.4 s)."""
        if isinstance(value, Int4Rows | Int8Rows):
            layer = value.layer()
        elif streamed and name.endswith(LINEAR_WEIGHTS) and value.dim() == 2:
            head = value.shape[0] == config.vocab_size  # quantize's rule: the vocabulary's layer is int8
            layer = quantized_layer(value, "int8" if head else dtype, group)
            if layer is None:  # a shape the kernels cannot hold: float, as ``quantize`` leaves it
                return value
        else:
            return value
        if not name.endswith((".in_proj.weight", ".out_proj.weight", ".fc1.weight")):
            return_freed_memory()
        return layer

    keep = dtype if group == BLOCK else None
    with fitting_threads():  # beside another process's busy core a second thread only waits (int8: 3.4 s, not 1.9)
        state = decoder_state_from_llama(model.tensors(keep), config, str(model.path), convert=convert)
        layers = {name: state.pop(name) for name in list(state) if isinstance(state[name], torch.nn.Module)}
        with unwritten():
            decoder = Decoder(config)
        load_weights(decoder, state, str(model.path), optional=tuple(layers), assign=True)
        if "tok_emb.weight" in layers:  # the Q8_0 embedding as the tied head's int8 layer: lookups read its rows
            decoder.lm_head.proj = layers.pop("tok_emb.weight")
            decoder.tok_emb = QuantizedEmbedding(decoder.lm_head.proj)
        for name, layer in layers.items():  # the float nn.Linear (never written) goes; the quantized layer comes
            parent, _, attr = name.removesuffix(".weight").rpartition(".")
            setattr(decoder.get_submodule(parent), attr, layer)
        match_activations(decoder)
    return decoder.eval(), tok


LINEAR_WEIGHTS = (".in_proj.weight", ".out_proj.weight", ".fc1.weight", ".fc2.weight", "lm_head.proj.weight")
