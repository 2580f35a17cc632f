"""GGUF in and out: llama.cpp's one-file format (metadata + tensors), read and written with the ``gguf`` package.

A GGUF file holds what a Hugging Face folder spreads over config.json, tokenizer.json and the weights:

    metadata   llama.block_count = 30, llama.attention.head_count_kv = 3, tokenizer.ggml.tokens = [...],
               tokenizer.ggml.merges = [...], tokenizer.chat_template = "{% for message in messages %}..."
    tensors    blk.0.attn_q.weight  Q4_1  [576, 576]   (shapes as ggml writes them: fastest dimension first)

Reading gives Hugging Face Llama names and layout (``interop/llama.py`` maps those to the one Decoder):

    token_embd -> model.embed_tokens     blk.i.attn_q/k/v/output -> model.layers.i.self_attn.q/k/v/o_proj
    output_norm -> model.norm            blk.i.ffn_gate/up/down -> model.layers.i.mlp.gate/up/down_proj
    output -> lm_head                    blk.i.attn_norm, ffn_norm -> input_layernorm, post_attention_layernorm

Two things to undo. (1) Quantisation: blocks of 32 weights share a scale (and an offset), dequantized here to
float32 (``dequantize``). (2) llama.cpp's converter permutes the rows of W_q and W_k: within each head it
interleaves the two halves (rows [0, d/2) and [d/2, d)) so that its rotary code can rotate adjacent pairs; HF's
and lmforge's rotate half against half, so the rows go back (``unpermute``; ``permute`` for writing).

A GGUF file carries no checksum: it is checked by its own sizes (a truncated file, a tensor whose bytes do not
match its shape and type, is refused) and loads as unverified.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.files import atomic_path

TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")  # what lmforge dequantizes
BLOCK = 32  # weights per quantisation block (Q8_0, Q4_0, Q4_1)
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


# -- dequantization: the three block formats, written out ------------------------------------------------------
def dequantize(raw: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """Bytes of one tensor -> float32 values of ``shape`` (rows, row length).

    Q8_0  per block: scale d (f16), 32 int8 q                         x = d q
    Q4_0  per block: d (f16), 32 4-bit q (low nibbles first)          x = d (q - 8)
    Q4_1  per block: d (f16), offset m (f16), 32 4-bit q              x = d q + m

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
    head = {"Q8_0": 2, "Q4_0": 2, "Q4_1": 4}[kind]  # bytes of scale (and offset) per block
    width = head + (BLOCK if kind == "Q8_0" else BLOCK // 2)
    blocks = raw.reshape(-1, width)  # (n_blocks, bytes)
    d = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)
    if kind == "Q8_0":
        q = blocks[:, 2:].view(np.int8).astype(np.float32)  # (n_blocks, 32)
        return (d * q).reshape(shape)
    packed = blocks[:, head:]  # (n_blocks, 16): value j in the low nibble of byte j, value 16 + j in the high
    q = np.concatenate([packed & 0x0F, packed >> 4], axis=1).astype(np.float32)  # (n_blocks, 32)
    if kind == "Q4_0":
        return (d * (q - 8)).reshape(shape)
    m = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    return (d * q + m).reshape(shape)


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
@dataclass
class GGUFModel:
    """What a GGUF file describes: the architecture, a Hugging Face Llama config, the tokenizer's metadata, the
    chat template, and the tensors (read and dequantized on ``tensors()``)."""

    path: Path
    architecture: str
    hf_config: dict[str, Any]
    metadata: dict[str, Any] = field(repr=False)
    reader: Any = field(repr=False)

    @property
    def chat_template(self) -> str | None:
        return self.metadata.get("tokenizer.chat_template")

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor as float32, by its Hugging Face Llama name, W_q and W_k rows back in HF order."""
        heads, kv_heads = self.hf_config["num_attention_heads"], self.hf_config["num_key_value_heads"]
        out = {}
        for t in self.reader.tensors:
            kind = t.tensor_type.name
            if kind not in TYPES:
                raise LmforgeError(f"{self.path}: tensor {t.name} is of type {kind}; lmforge reads "
                                   f"{', '.join(TYPES)}")
            shape = tuple(int(n) for n in reversed(t.shape.tolist()))  # ggml writes the fastest dimension first
            values = dequantize(np.asarray(t.data), kind, shape)
            name = hf_name(t.name, self.path)
            if name.endswith("q_proj.weight"):
                values = unpermute(values, heads)
            elif name.endswith("k_proj.weight"):
                values = unpermute(values, kv_heads)
            out[name] = torch.from_numpy(np.ascontiguousarray(values))
        return out


def hf_name(name: str, path: Path) -> str:
    """``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``."""
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in TOP_NAMES:
        return f"{TOP_NAMES[parts[0]]}.{parts[1]}"
    raise LmforgeError(f"{path}: tensor {name} is not part of a Llama model lmforge knows")


def field_value(field: Any) -> Any:
    """A GGUFReader field as a Python value: a string, a number, a bool, or a list of those."""
    gguf = gguf_module()
    kinds = field.types
    if not kinds:
        return None

    def scalar(part: Any, kind: Any) -> Any:
        if kind == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8", errors="replace")
        value = part.tolist()[0]
        return bool(value) if kind == gguf.GGUFValueType.BOOL else value

    if kinds[0] == gguf.GGUFValueType.ARRAY:
        return [scalar(field.parts[i], kinds[-1]) for i in field.data]
    return scalar(field.parts[field.data[0]], kinds[0])


def read_gguf(path: str | os.PathLike) -> GGUFModel:
    """The metadata of a GGUF file (tensors stay on disk until ``tensors()``); one line for what is not a
    Llama-family GGUF lmforge can read."""
    gguf = gguf_module()
    path = Path(path)
    if not path.is_file():
        raise LmforgeError(f"{path}: no such GGUF file")
    try:
        reader = gguf.GGUFReader(path)
    except (ValueError, OSError, IndexError, KeyError) as err:  # bad magic, truncated header or data
        raise LmforgeError(f"{path}: not a readable GGUF file ({str(err).splitlines()[0] or type(err).__name__})") \
            from None
    metadata = {name: field_value(f) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    arch = metadata.get("general.architecture")
    if arch != "llama":
        raise LmforgeError(f"{path}: architecture {arch!r} is not supported (lmforge reads Llama-family GGUF "
                           "files: general.architecture = llama)")
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size:
            raise LmforgeError(f"{path}: truncated: tensor {t.name} ends at byte {t.data_offset + t.n_bytes} of a "
                               f"{size}-byte file")
    return GGUFModel(path, arch, llama_config(metadata, reader, path), metadata, reader)


def llama_config(m: dict[str, Any], reader: Any, path: Path) -> dict[str, Any]:
    """The Hugging Face LlamaConfig (as a dict) that the metadata describes."""
    def need(key: str) -> Any:
        if key not in m:
            raise LmforgeError(f"{path}: metadata {key} is missing")
        return m[key]

    heads = need("llama.attention.head_count")
    vocab = m.get("llama.vocab_size") or len(need("tokenizer.ggml.tokens"))
    untied = any(t.name == "output.weight" for t in reader.tensors)
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": need("llama.embedding_length"), "intermediate_size": need("llama.feed_forward_length"),
            "num_hidden_layers": need("llama.block_count"), "num_attention_heads": heads,
            "num_key_value_heads": m.get("llama.attention.head_count_kv", heads),
            "rms_norm_eps": need("llama.attention.layer_norm_rms_epsilon"),
            "rope_theta": m.get("llama.rope.freq_base", 10000.0),
            "max_position_embeddings": m.get("llama.context_length", 2048), "tie_word_embeddings": not untied,
            "bos_token_id": m.get("tokenizer.ggml.bos_token_id"), "eos_token_id": m.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": m.get("tokenizer.ggml.padding_token_id"), "hidden_act": "silu",
            "attention_bias": False, "mlp_bias": False}


def gguf_tokenizer(model: GGUFModel):
    """The tokenizer a GGUF's metadata describes, as ``transformers`` builds it from the same file: GPT-2 style
    byte-level BPE (tokens, merges, GPT-2's split), the control tokens special (split out of text), the
    bos / eos / unk / pad ids from the file."""
    from lmforge.tokenizers import from_huggingface

    m = model.metadata
    if m.get("tokenizer.ggml.model") != "gpt2":
        raise LmforgeError(f"{model.path}: tokenizer model {m.get('tokenizer.ggml.model')!r} is not supported "
                           "(lmforge reads byte-level BPE: tokenizer.ggml.model = gpt2)")
    tokens, types = m["tokenizer.ggml.tokens"], m.get("tokenizer.ggml.token_type") or []
    control = [{"id": i, "content": t, "special": True} for i, (t, kind) in enumerate(zip(tokens, types, strict=False))
               if kind == TOKEN_TYPES["control"]]
    data = {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)},
                      "merges": m.get("tokenizer.ggml.merges") or []},
            "added_tokens": control, "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}}
    tok = from_huggingface(data, str(model.path))
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                      ("pad", "padding_token_id")):
        index = m.get(f"tokenizer.ggml.{key}")
        if index is not None and index < len(tokens):
            tok.set_role(role, tokens[index])
    return tok


def load_gguf(path: str | os.PathLike) -> tuple[torch.nn.Module, Any]:
    """(lmforge Decoder in eval mode, tokenizer with the file's chat template) from a Llama-family GGUF file."""
    from lmforge.interop.llama import decoder_config_from_llama, decoder_state_from_llama
    from lmforge.models.decoder import Decoder
    from lmforge.models.registry import load_weights

    model = read_gguf(path)
    config = decoder_config_from_llama(model.hf_config, str(model.path))
    decoder = Decoder(config)
    load_weights(decoder, decoder_state_from_llama(model.tensors(), config, str(model.path)), str(model.path))
    tokenizer = gguf_tokenizer(model)
    if tokenizer.vocab_size > config.vocab_size:
        raise LmforgeError(f"{model.path}: the tokenizer has {tokenizer.vocab_size} tokens but the model only "
                           f"{config.vocab_size} embeddings")
    tokenizer.chat_template = model.chat_template
    return decoder.eval(), tokenizer


# -- writing --------------------------------------------------------------------------------------------------
WRITE_TYPES = ("f32", "f16", "q8_0")


def write_gguf(path: str | os.PathLike, hf_config: dict[str, Any], state: dict[str, torch.Tensor], tokenizer: Any,
               chat_template: str | None = None, dtype: str = "f16", name: str = "lmforge model") -> Path:
    """A Llama-family model (HF config + HF-named tensors) and its byte-level BPE tokenizer -> one GGUF file,
    written to a temporary file beside ``path`` and renamed (never half-written). Matrices in ``dtype``
    (f32, f16 or q8_0); norms stay f32, as llama.cpp writes them."""
    gguf = gguf_module()
    from lmforge.tokenizers.byte_bpe import ByteLevelBPETokenizer

    if dtype not in WRITE_TYPES:
        raise LmforgeError(f"--dtype: {dtype!r} is not one of {', '.join(WRITE_TYPES)}")
    if not isinstance(tokenizer, ByteLevelBPETokenizer):
        raise LmforgeError(f"GGUF export needs a byte-level BPE tokenizer, not {type(tokenizer).__name__}")
    c, path = hf_config, Path(path)
    qtype = {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[dtype]
    with atomic_path(path) as tmp:
        w = gguf.GGUFWriter(str(tmp), "llama")
        w.add_name(name)
        w.add_block_count(c["num_hidden_layers"])
        w.add_context_length(c["max_position_embeddings"])
        w.add_embedding_length(c["hidden_size"])
        w.add_feed_forward_length(c["intermediate_size"])
        w.add_head_count(c["num_attention_heads"])
        w.add_head_count_kv(c["num_key_value_heads"])
        w.add_rope_freq_base(float(c["rope_theta"]))
        w.add_layer_norm_rms_eps(float(c["rms_norm_eps"]))
        w.add_vocab_size(c["vocab_size"])
        w.add_rope_dimension_count(c["hidden_size"] // c["num_attention_heads"])
        w.add_file_type({"f32": 0, "f16": 1, "q8_0": 7}[dtype])
        add_tokenizer(w, tokenizer, c, chat_template)
        heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        for hf, tensor in state.items():
            values = tensor.detach().float().cpu().numpy()
            if hf.endswith("q_proj.weight"):
                values = permute(values, heads)
            elif hf.endswith("k_proj.weight"):
                values = permute(values, kv_heads)
            kind = qtype if values.ndim == 2 and values.shape[-1] % BLOCK == 0 else gguf.GGMLQuantizationType.F32
            data = values.astype(np.float16) if kind == gguf.GGMLQuantizationType.F16 else \
                gguf.quants.quantize(values, kind) if kind == gguf.GGMLQuantizationType.Q8_0 else values
            w.add_tensor(gguf_name(hf), data, raw_dtype=kind)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return path


def gguf_name(hf: str) -> str:
    """The inverse of ``hf_name``."""
    if hf.startswith("model.layers."):
        _, _, i, *rest = hf.split(".")
        inner, suffix = ".".join(rest[:-1]), rest[-1]
        short = next(k for k, v in LAYER_NAMES.items() if v == inner)
        return f"blk.{i}.{short}.{suffix}"
    stem, suffix = hf.rsplit(".", 1)
    return f"{next(k for k, v in TOP_NAMES.items() if v == stem)}.{suffix}"


def add_tokenizer(w: Any, tok: Any, c: dict[str, Any], chat_template: str | None) -> None:
    """The byte-level BPE tokenizer as llama.cpp's metadata: tokens, their types, merges, the special ids."""
    specials = set(tok.special_tokens.values())
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2" if tok.pattern_name == "gpt2" else "llama-bpe")
    w.add_token_list(tok.id_to_token)
    w.add_token_types([TOKEN_TYPES["control"] if i in specials else TOKEN_TYPES["normal"]
                       for i in range(tok.vocab_size)])
    w.add_token_merges([f"{a} {b}" for a, b in tok.merges])
    for role, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id),
                      ("pad", w.add_pad_token_id)):
        index = getattr(tok, f"{role}_id")
        if index is not None:
            add(index)
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
