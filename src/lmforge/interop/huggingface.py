"""Hugging Face BERT and GPT-2 directories, both ways.

    load_hf(dir)                   a Hugging Face directory -> an lmforge model (eval mode)
    convert_from_hf(dir, out)      ... saved as an lmforge model directory, tokenizer files copied
    convert_to_hf(dir, out)        an lmforge Encoder / Decoder directory -> a directory transformers loads

Weights come from ``model.safetensors`` (or a sharded ``model.safetensors.index.json``) or from
``pytorch_model.bin``, read with ``torch.load(weights_only=True)`` so no pickled code ever runs.
The model type is read from config.json's ``model_type`` / ``architectures``.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.files import copy_file, write_text_atomic
from lmforge.interop import bert, gpt2
from lmforge.manifest import write_manifest
from lmforge.models.config import DecoderConfig, EncoderConfig, read_json
from lmforge.models.registry import (
    WEIGHTS_NAME,
    build_model,
    load_pretrained,
    load_weights,
    read_weights,
    save_pretrained,
    save_weights,
    state_dict_untied,
)

SUPPORTED = {**bert.ARCHITECTURES, **gpt2.ARCHITECTURES, "LlamaForCausalLM": "Decoder"}  # HF -> lmforge
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                      "vocab.json", "merges.txt", "chat_template.jinja")


def is_hf_dir(path: str | os.PathLike) -> bool:
    """A directory whose config.json has Hugging Face's ``model_type`` (and not lmforge's ``kind``)."""
    cfg = Path(path) / "config.json"
    if not cfg.exists():
        return False
    data = read_json(cfg)
    return "model_type" in data and "kind" not in data


def hf_architecture(hf: dict[str, Any], source: str) -> str:
    """The supported HF architecture named by config.json, or a clear error listing the supported ones."""
    model_type = hf.get("model_type")
    archs = hf.get("architectures") or []
    supported = ", ".join(SUPPORTED)
    for arch in archs:
        if arch in SUPPORTED:
            return arch
    if archs:
        raise LmforgeError(f"{source}: unsupported architecture {archs[0]!r}; supported: {supported}")
    if model_type == "bert":
        return "BertModel"
    if model_type == "gpt2":
        return "GPT2LMHeadModel"
    raise LmforgeError(f"{source}: unsupported model_type {model_type!r}; supported architectures: {supported}")


def read_hf_weights(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of a HF checkpoint directory and the file they came from."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(read_json(index).get("weight_map", {}).values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(read_weights(folder / shard))
        return state, str(index)
    for name in (WEIGHTS_NAME, "pytorch_model.bin"):
        if (folder / name).exists():
            return read_weights(folder / name), str(folder / name)
    raise LmforgeError(f"{folder}: no model.safetensors or pytorch_model.bin")


def load_hf(path: str | os.PathLike, device: str | torch.device | None = None) -> nn.Module:
    """A Hugging Face BERT, GPT-2 or Llama-family directory as an lmforge model, in eval mode."""
    folder = Path(path)
    cfg_file = folder / "config.json"
    hf = read_json(cfg_file)
    if hf.get("model_type") == "llama" or "LlamaForCausalLM" in (hf.get("architectures") or []):
        from lmforge.interop.llama import load_llama_folder

        model, _ = load_llama_folder(folder)
        return model.to(device) if device is not None else model
    arch = hf_architecture(hf, str(cfg_file))
    state, source = read_hf_weights(folder)
    optional: tuple[str, ...] = ()
    if arch.startswith("Bert"):
        config = bert.config_from_hf(hf, str(cfg_file))
        num_labels = None
        if "Classification" in arch:
            w = state.get("classifier.weight")
            num_labels = int(w.shape[0]) if w is not None else len(hf.get("id2label") or {0: 0, 1: 1})
        model = build_model(config, SUPPORTED[arch], num_labels)
        check_shapes(state, model, source)
        prefix = "" if arch == "BertModel" else "encoder."
        tensors, unused = bert.weights_from_hf(state, config.n_layers, prefix, source)
        # BertForMaskedLM / ...TokenClassification checkpoints carry no pooler (and no NSP head).
        optional = (f"{prefix}pooler.", "nsp.")
    else:
        config = gpt2.config_from_hf(hf, str(cfg_file))
        model = build_model(config, "Decoder")
        check_shapes(state, model, source)
        tensors, unused = gpt2.weights_from_hf(state, config.n_layers, config.tie_embeddings, source)
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        warnings.warn(f"{source}: ignored tensor(s) {', '.join(unused[:3])}{more}", stacklevel=2)
    absent = load_weights(model, tensors, source, optional)
    if arch == "BertForTokenClassification":  # its pooler is unused: nothing to warn about
        absent = [k for k in absent if ".pooler." not in k]
    if absent:
        warnings.warn(f"{source}: {', '.join(absent[:2])}... not in the checkpoint, initialised randomly",
                      stacklevel=2)
    if device is not None:
        model.to(device)
    return model.eval()


def hf_name(key: str) -> str:
    """A HF tensor name without its optional model prefix (``bert.``, ``transformer.``)."""
    return bert.normalise_keys({key.removeprefix("transformer."): None}).popitem()[0]


def check_shapes(state: dict[str, torch.Tensor], model: nn.Module, source: str) -> None:
    """Compare the checkpoint's tensors with those our model would export, by their HF names."""
    c = model.config
    ours = state_dict_untied(model)
    if isinstance(c, EncoderConfig):
        want = bert.weights_to_hf(ours, c.n_layers, "" if type(model).__name__ == "Encoder" else "encoder.")
    else:
        want = gpt2.weights_to_hf(ours, c.n_layers, c.tie_embeddings)
    present = {hf_name(k): k for k in state}
    for name, tensor in want.items():  # in the model's order: the first misfit is reported
        key, expected = present.get(hf_name(name)), tuple(tensor.shape)
        if key is not None and tuple(state[key].shape) != expected:
            value = state[key]
            raise LmforgeError(f"{source}: tensor {key!r} has shape {tuple(value.shape)} but the config "
                               f"expects {expected}")


def unpadded(state: dict[str, torch.Tensor], config: DecoderConfig) -> dict[str, torch.Tensor]:
    """A decoder's tensors with the embedding rows beyond vocab_size (``vocab_multiple`` padding) cut off."""
    rows = config.vocab_size
    return {k: v[:rows] if k in ("tok_emb.weight", "lm_head.proj.weight") else v for k, v in state.items()}


def copy_tokenizer_files(src: Path, out: Path) -> list[str]:
    """Copy the tokenizer files found in ``src`` into ``out`` unchanged; return their names."""
    copied = []
    for name in HF_TOKENIZER_FILES:
        if (src / name).is_file():
            copy_file(src / name, out / name)
            copied.append(name)
    return copied


def convert_from_hf(path: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Hugging Face directory -> lmforge model directory (config.json, model.safetensors, tokenizer)."""
    src, dst = Path(path), Path(out)
    model = load_hf(src)
    save_pretrained(model, dst)
    write_manifest(dst, copy_tokenizer_files(src, dst))  # the copied files join the checksums
    return dst


def convert_to_hf(path: str | os.PathLike | nn.Module, out: str | os.PathLike) -> Path:
    """lmforge Encoder(ForPreTraining, ...Classification) or Decoder -> a directory transformers loads."""
    model = load_pretrained(path) if not isinstance(path, nn.Module) else path
    dst = Path(out)
    config = model.config
    state = state_dict_untied(model)
    arch = type(model).__name__
    if isinstance(config, EncoderConfig):
        labels = None if isinstance(path, nn.Module) else read_json(Path(path) / "config.json").get("labels")
        hf_config = bert.config_to_hf(config, arch, getattr(model, "num_labels", None), labels)
        tensors = bert.weights_to_hf(state, config.n_layers, "" if arch == "Encoder" else "encoder.")
        if arch == "EncoderForTokenClassification":  # BertForTokenClassification has no pooler
            tensors = {k: v for k, v in tensors.items() if not k.startswith("bert.pooler.")}
    elif isinstance(config, DecoderConfig) and config.is_gpt2():
        hf_config = gpt2.config_to_hf(config)
        tensors = gpt2.weights_to_hf(unpadded(state, config), config.n_layers, config.tie_embeddings)
    elif isinstance(config, DecoderConfig):  # the modern switches: a Llama-family model, or nothing HF holds
        from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder

        hf_config = llama_config_from_decoder(config)  # refuses what LlamaForCausalLM cannot hold
        tensors = llama_state_from_decoder(unpadded(state, config), config)
    else:
        raise LmforgeError(f"{arch}: only Encoder (BERT) and Decoder (GPT-2, Llama-family) models export to "
                           "Hugging Face")
    dst.mkdir(parents=True, exist_ok=True)  # only once the model is known to export
    save_weights(tensors, dst / WEIGHTS_NAME)
    write_text_atomic(dst / "config.json", json.dumps(hf_config, indent=2) + "\n")
    if not isinstance(path, nn.Module):
        export_tokenizer(Path(path), dst)
    write_manifest(dst, [n for n in (WEIGHTS_NAME, "config.json", *HF_TOKENIZER_FILES) if (dst / n).is_file()])
    return dst


def export_tokenizer(src: Path, dst: Path) -> None:
    """Copy the tokenizer files; an lmforge-format tokenizer.json is rewritten in Hugging Face's format, with a
    tokenizer_config.json naming its special tokens and its chat template (what ``AutoTokenizer`` reads)."""
    copied = copy_tokenizer_files(src, dst)
    if "tokenizer.json" in copied and read_json(src / "tokenizer.json").get("format") == "lmforge-tokenizer":
        from lmforge.tokenizers import load_tokenizer, save_huggingface

        tok = load_tokenizer(src / "tokenizer.json")
        save_huggingface(tok, dst)
        settings = {f"{role}_token": tok.roles[role] for role in ("bos", "eos", "unk", "pad", "cls", "sep", "mask")
                    if role in tok.roles}
        config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, **settings,
                  **({"chat_template": tok.chat_template} if tok.chat_template else {})}
        write_text_atomic(dst / "tokenizer_config.json", json.dumps(config, indent=2, ensure_ascii=False) + "\n")
