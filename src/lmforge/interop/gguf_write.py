"""Writing a GGUF file, llama.cpp's one-file format, from a Llama-family model (``lmforge convert --to-gguf``): the
Hugging Face config as llama.cpp's metadata, the byte-level BPE tokenizer as its ``tokenizer.ggml.*`` keys, and
the tensors under llama.cpp's names (W_q / W_k rows back in its rotary order, ``gguf.permute``), quantized by the
``gguf`` package's own quantizers. Reading is ``interop/gguf.py``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.files import atomic_path
from lmforge.interop.gguf import BLOCK, LAYER_NAMES, TOKEN_TYPES, TOP_NAMES, gguf_module, permute

WRITE_TYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1")
FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 7}  # general.file_type: llama.cpp's ftype


def write_gguf(path: str | os.PathLike, hf_config: dict[str, Any], state: dict[str, torch.Tensor], tokenizer: Any,
               chat_template: str | None = None, dtype: str = "f16", name: str = "lmforge model") -> Path:
    """A Llama-family model (HF config + HF-named tensors) and its byte-level BPE tokenizer -> one GGUF file,
    written to a temporary file beside ``path`` and renamed (never half-written). Matrices in ``dtype``
    (f32, f16, q8_0, q4_0 or q4_1: the ``gguf`` package's quantizers); norms stay f32, as llama.cpp writes
    them. A 4-bit file keeps the vocabulary's matrices (the embedding, the head) in Q8_0, as SmolLM2's own Q4_1
    file does: they score every token, and a 4-bit head costs SmolLM2 7.5% of perplexity, an 8-bit one ~0.2%
    (docs/models.md)."""
    gguf = gguf_module()
    from lmforge.tokenizers.byte_bpe import ByteLevelBPETokenizer

    if dtype not in WRITE_TYPES:
        raise LmforgeError(f"--dtype: {dtype!r} is not one of {', '.join(WRITE_TYPES)}")
    if not isinstance(tokenizer, ByteLevelBPETokenizer):
        raise LmforgeError(f"GGUF export needs a byte-level BPE tokenizer, not {type(tokenizer).__name__}")
    c, path = hf_config, Path(path)
    qtype = gguf.GGMLQuantizationType[dtype.upper()]
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
        w.add_file_type(FILE_TYPES[dtype])
        add_tokenizer(w, tokenizer, c, chat_template)
        heads, kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        for hf, tensor in state.items():
            values = tensor.detach().float().cpu().numpy()
            if hf.endswith("q_proj.weight"):
                values = permute(values, heads)
            elif hf.endswith("k_proj.weight"):
                values = permute(values, kv_heads)
            kind = qtype if values.ndim == 2 and values.shape[-1] % BLOCK == 0 else gguf.GGMLQuantizationType.F32
            if dtype in ("q4_0", "q4_1") and hf in ("model.embed_tokens.weight", "lm_head.weight") and \
                    kind == qtype:
                kind = gguf.GGMLQuantizationType.Q8_0
            data = values.astype(np.float16) if kind == gguf.GGMLQuantizationType.F16 else \
                values if kind == gguf.GGMLQuantizationType.F32 else gguf.quants.quantize(values, kind)
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
