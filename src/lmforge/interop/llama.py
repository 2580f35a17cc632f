"""Llama-family checkpoints in Hugging Face layout <-> lmforge's Decoder (the one Decoder, with its switches).

A Llama is the modern decoder: RMSNorm before each sublayer, rotary positions (rotate-half layout, the same
as ``lmforge.nn.RotaryEmbedding``), a SwiGLU feed-forward, no biases, grouped-query attention. The config:

    LlamaConfig                          DecoderConfig
    hidden_size                          d_model
    intermediate_size                    d_ff
    num_hidden_layers                    n_layers
    num_attention_heads                  n_heads
    num_key_value_heads                  n_kv_heads
    rms_norm_eps                         eps                      norm = rmsnorm
    rope_theta (rope_parameters)         rope_base                positions = rotary
    hidden_act = silu                                             activation = swiglu
    attention_bias = mlp_bias            bias
    tie_word_embeddings                  tie_embeddings
    max_position_embeddings              max_positions
    bos/eos/pad_token_id                 bos_id / eos_id / pad_id  (a list of eos ids: the first)

Tensors (``model.`` prefix present or absent):

    embed_tokens                                  -> tok_emb
    layers.i.input_layernorm                      -> layers.i.norm1
    layers.i.self_attn.{q,k,v}_proj               -> layers.i.self_attn.in_proj     rows [W_q; W_k; W_v]
    layers.i.self_attn.o_proj                     -> layers.i.self_attn.out_proj
    layers.i.post_attention_layernorm             -> layers.i.norm2
    layers.i.mlp.{gate,up}_proj                   -> layers.i.ffn.fc1               rows [W_g; W_u]
    layers.i.mlp.down_proj                        -> layers.i.ffn.fc2
    norm                                          -> norm_f
    lm_head                                       -> lm_head.proj                   (absent when tied)

What lmforge cannot compute the same way (rope scaling, a head width other than hidden / heads, biases on
attention but not on the feed-forward, ...) is refused in one line rather than loaded into a model that
computes something else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.models.config import DecoderConfig, read_json
from lmforge.models.decoder import Decoder
from lmforge.models.registry import WEIGHTS_NAME, load_weights, read_weights
from lmforge.models.unwritten import unwritten

ARCHITECTURES = {"LlamaForCausalLM": "Decoder"}
PROJECTIONS = ("q_proj", "k_proj", "v_proj")  # stacked in this order into in_proj
GATED = ("gate_proj", "up_proj")  # stacked into fc1: FeedForward's swiglu takes the gate first
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # a buffer some old checkpoints saved: recomputed, not loaded


# -- the config ------------------------------------------------------------------------------------------------
def rope_settings(hf: dict[str, Any], source: str) -> float:
    """The rotary base of a Llama config, old (``rope_theta``, ``rope_scaling``) or new (``rope_parameters``)."""
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    for where, entry in (("rope_parameters", params), ("rope_scaling", scaling)):
        kind = entry.get("rope_type", entry.get("type", "default"))
        if kind != "default":
            raise LmforgeError(f"{source}: {where} of type {kind!r} is not supported (only unscaled rotary "
                               f"positions)")
    base = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if not isinstance(base, int | float) or isinstance(base, bool) or base <= 0:
        raise LmforgeError(f"{source}: rope_theta must be a positive number, got {base!r}")
    return float(base)


def first_id(value: Any) -> int | None:
    """A token id, or the first of a list of them (Llama 3 lists several end-of-sequence ids)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value


def decoder_config_from_llama(hf: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """A Hugging Face LlamaConfig (as a dict) -> the DecoderConfig of the same model.

    >>> c = decoder_config_from_llama({"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536,
    ...     "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
    ...     "rope_theta": 100000.0, "tie_word_embeddings": True})
    >>> c.n_heads, c.n_kv_heads, c.rope_base, c.norm, c.activation, c.positions, c.bias
    (9, 3, 100000.0, 'rmsnorm', 'swiglu', 'rotary', False)
    """
    model_type, archs = hf.get("model_type", "llama"), hf.get("architectures") or ["LlamaForCausalLM"]
    if model_type != "llama" or not any(a in ARCHITECTURES for a in archs):
        raise LmforgeError(f"{source}: not a Llama causal LM (model_type {model_type!r}, architectures {archs}); "
                           f"supported: {', '.join(ARCHITECTURES)}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise LmforgeError(f"{source}: hidden_act {act!r} is not supported (Llama's SwiGLU uses silu)")
    attention_bias, mlp_bias = bool(hf.get("attention_bias", False)), bool(hf.get("mlp_bias", False))
    if attention_bias != mlp_bias:
        raise LmforgeError(f"{source}: attention_bias={attention_bias} with mlp_bias={mlp_bias} is not supported "
                           f"(lmforge has one bias switch)")
    try:
        d, n_heads = hf["hidden_size"], hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or d // n_heads
        if head_dim * n_heads != d:
            raise LmforgeError(f"{source}: head_dim={head_dim} with {n_heads} heads is not hidden_size={d} "
                               f"(lmforge's heads split the width)")
        values = dict(
            vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["num_hidden_layers"], n_heads=n_heads,
            d_ff=hf["intermediate_size"], max_positions=hf.get("max_position_embeddings", 2048),
            n_kv_heads=hf.get("num_key_value_heads") or n_heads, rope_base=rope_settings(hf, source),
            dropout=0.0, attention_dropout=float(hf.get("attention_dropout", 0.0)), activation="swiglu",
            eps=float(hf.get("rms_norm_eps", 1e-6)), norm="rmsnorm", positions="rotary", bias=attention_bias,
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)), pad_id=first_id(hf.get("pad_token_id")),
            bos_id=first_id(hf.get("bos_token_id")), eos_id=first_id(hf.get("eos_token_id")),
        )
    except KeyError as err:
        raise LmforgeError(f"{source}: missing field {err.args[0]!r}") from None
    return DecoderConfig.from_dict(values, source)  # every value checked by its field, errors naming the file


def llama_config_from_decoder(c: DecoderConfig) -> dict[str, Any]:
    """A Decoder's config -> the config.json of the LlamaForCausalLM that computes the same logits."""
    llama = {"norm": "rmsnorm", "positions": "rotary", "activation": "swiglu", "qk_norm": False, "logit_softcap": None}
    changed = [f"{k}={getattr(c, k)}" for k, v in llama.items() if getattr(c, k) != v]
    if changed:  # LlamaForCausalLM has no place for them: refuse rather than write a model that computes otherwise
        raise LmforgeError(f"cannot export to Hugging Face: this Decoder uses {', '.join(changed)}, so it is neither "
                           "GPT-2 (layernorm, learned positions, gelu) nor Llama (norm=rmsnorm, positions=rotary, "
                           "activation=swiglu, no QK-norm, no soft-cap)")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": c.vocab_size,
        "hidden_size": c.d_model, "intermediate_size": c.d_ff, "num_hidden_layers": c.n_layers,
        "num_attention_heads": c.n_heads, "num_key_value_heads": c.n_kv_heads or c.n_heads,
        "head_dim": c.d_model // c.n_heads, "hidden_act": "silu", "max_position_embeddings": c.max_positions,
        "rms_norm_eps": c.eps, "rope_theta": c.rope_base, "rope_scaling": None,
        "attention_bias": c.bias, "mlp_bias": c.bias, "attention_dropout": c.attention_dropout,
        "tie_word_embeddings": c.tie_embeddings, "bos_token_id": c.bos_id, "eos_token_id": c.eos_id,
        "pad_token_id": c.pad_id, "initializer_range": 0.02, "use_cache": True,
    }


# -- the tensors -----------------------------------------------------------------------------------------------
def decoder_state_from_llama(
    state: Mapping[str, torch.Tensor], config: DecoderConfig, source: str = "checkpoint",
    convert: Callable[[str, Any], Any] | None = None,
) -> dict[str, torch.Tensor]:
    """HF Llama tensors -> the state dict of lmforge's Decoder (without the tied head's alias). Each tensor of
    ``state`` is looked up once, in the Decoder's order: a mapping that reads on lookup (``gguf.TensorReader``)
    holds one layer's parts at a time. ``convert(name, value)`` is applied to each value as it is made (GGUF: a
    matrix becomes its quantized layer at once, so that the whole model's unpacked integers or float32 weights
    never exist together)."""
    names = {k.removeprefix("model."): k for k in state if not k.endswith(IGNORED_SUFFIXES)}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in names:
            raise LmforgeError(f"{source}: missing tensor {name!r}")
        used.add(name)
        return state[names[name]]

    def stacked(prefix: str, parts: tuple[str, ...], kind: str) -> torch.Tensor:
        values = [take(f"{prefix}.{part}.{kind}") for part in parts]
        if not any(isinstance(v, torch.Tensor) for v in values):  # rows kept quantized (interop.gguf.Int4Rows)
            return values[0].stack(values)
        return torch.cat([v if isinstance(v, torch.Tensor) else v.dequantized() for v in values], dim=0)

    out: dict[str, Any] = {}

    def put(name: str, value: Any) -> None:
        out[name] = convert(name, value) if convert is not None else value

    put("tok_emb.weight", take("embed_tokens.weight"))
    for i in range(config.n_layers):
        src, dst = f"layers.{i}", f"layers.{i}"
        kinds = ("weight", "bias") if config.bias else ("weight",)
        put(f"{dst}.norm1.weight", take(f"{src}.input_layernorm.weight"))
        put(f"{dst}.norm2.weight", take(f"{src}.post_attention_layernorm.weight"))
        for kind in kinds:
            put(f"{dst}.self_attn.in_proj.{kind}", stacked(f"{src}.self_attn", PROJECTIONS, kind))
            put(f"{dst}.self_attn.out_proj.{kind}", take(f"{src}.self_attn.o_proj.{kind}"))
            put(f"{dst}.ffn.fc1.{kind}", stacked(f"{src}.mlp", GATED, kind))
            put(f"{dst}.ffn.fc2.{kind}", take(f"{src}.mlp.down_proj.{kind}"))
    put("norm_f.weight", take("norm.weight"))
    if config.tie_embeddings:
        used.add("lm_head.weight")  # some tied checkpoints store the embedding twice
    else:
        put("lm_head.proj.weight", take("lm_head.weight"))
    unused = sorted(set(names) - used)
    if unused:
        raise LmforgeError(f"{source}: unexpected tensor {unused[0]!r} (not in a Llama of this config)")
    return out


def llama_state_from_decoder(state: dict[str, torch.Tensor], config: DecoderConfig) -> dict[str, torch.Tensor]:
    """lmforge Decoder tensors -> HF LlamaForCausalLM names (``model.`` prefix; ``lm_head`` only when untied)."""
    d_head = config.d_model // config.n_heads
    n_kv = config.n_kv_heads or config.n_heads
    widths = [config.n_heads * d_head, n_kv * d_head, n_kv * d_head]  # the blocks of in_proj: W_q, W_k, W_v
    out = {"model.embed_tokens.weight": state["tok_emb.weight"]}
    for i in range(config.n_layers):
        src, dst = f"layers.{i}", f"model.layers.{i}"
        out[f"{dst}.input_layernorm.weight"] = state[f"{src}.norm1.weight"]
        out[f"{dst}.post_attention_layernorm.weight"] = state[f"{src}.norm2.weight"]
        for kind in ("weight", "bias") if config.bias else ("weight",):
            blocks = state[f"{src}.self_attn.in_proj.{kind}"].split(widths, dim=0)
            for part, block in zip(PROJECTIONS, blocks, strict=True):
                out[f"{dst}.self_attn.{part}.{kind}"] = block.contiguous()
            out[f"{dst}.self_attn.o_proj.{kind}"] = state[f"{src}.self_attn.out_proj.{kind}"]
            for part, block in zip(GATED, state[f"{src}.ffn.fc1.{kind}"].chunk(2, dim=0), strict=True):
                out[f"{dst}.mlp.{part}.{kind}"] = block.contiguous()
            out[f"{dst}.mlp.down_proj.{kind}"] = state[f"{src}.ffn.fc2.{kind}"]
    out["model.norm.weight"] = state["norm_f.weight"]
    if not config.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    return out


# -- a save_pretrained folder ----------------------------------------------------------------------------------
def read_safetensors_folder(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """All tensors of ``model.safetensors`` or of the shards a ``model.safetensors.index.json`` names.

    Safetensors only: a folder holding only pickled weights (``pytorch_model.bin``) is refused.
    """
    index = folder / f"{WEIGHTS_NAME}.index.json"
    if index.exists():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise LmforgeError(f"{index}: no weight_map")
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(read_weights(folder / shard))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise LmforgeError(f"{index}: tensor {missing[0]!r} is not in its shard {weight_map[missing[0]]}")
        return state, str(index)
    if (folder / WEIGHTS_NAME).exists():
        return read_weights(folder / WEIGHTS_NAME), str(folder / WEIGHTS_NAME)
    if (folder / "pytorch_model.bin").exists():
        raise LmforgeError(f"{folder}: only pickled weights (pytorch_model.bin); re-save the model with "
                           f"safe_serialization=True to get model.safetensors")
    raise LmforgeError(f"{folder}: no {WEIGHTS_NAME} or {WEIGHTS_NAME}.index.json")


def load_llama_folder(path: str | os.PathLike) -> tuple[Decoder, dict[str, Any]]:
    """A ``LlamaForCausalLM.save_pretrained`` folder -> (lmforge Decoder in eval mode, the HF config dict)."""
    folder = Path(path)
    hf = read_json(folder / "config.json")
    config = decoder_config_from_llama(hf, str(folder / "config.json"))
    state, source = read_safetensors_folder(folder)
    with unwritten():  # every weight comes from the file: none initialised for nothing (models/unwritten.py)
        model = Decoder(config)
    load_weights(model, decoder_state_from_llama(state, config, source), source, assign=True)
    return model.eval(), hf
