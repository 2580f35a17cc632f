"""GPT-2 checkpoints in Hugging Face layout <-> lmforge's Decoder.

GPT-2 stores its projections as ``Conv1D`` weights of shape (in, out), the transpose of ``nn.Linear``;
``c_attn`` is already fused, its output columns ordered [q | k | v], which is exactly our ``in_proj``
rows [W_q; W_k; W_v] after transposing. Names (``transformer.`` prefix present or absent):

    wte, wpe                       -> tok_emb, pos_emb.embedding
    h.i.ln_1, h.i.ln_2             -> layers.i.norm1, layers.i.norm2
    h.i.attn.c_attn, attn.c_proj   -> layers.i.self_attn.in_proj, self_attn.out_proj     (transposed)
    h.i.mlp.c_fc, mlp.c_proj       -> layers.i.ffn.fc1, ffn.fc2                          (transposed)
    ln_f                           -> norm_f
    lm_head                        -> lm_head.proj (tied to wte unless tie_word_embeddings is false)
"""

from __future__ import annotations

from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.models.config import DecoderConfig

ACTIVATIONS_IN = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}
ACTIVATIONS_OUT = {"gelu_tanh": "gelu_new", "gelu": "gelu", "relu": "relu"}
ARCHITECTURES = {"GPT2Model": "Decoder", "GPT2LMHeadModel": "Decoder"}
LAYER = {  # HF name inside h.i -> (ours inside layers.i, Conv1D weight to transpose)
    "ln_1": ("norm1", False),
    "attn.c_attn": ("self_attn.in_proj", True),
    "attn.c_proj": ("self_attn.out_proj", True),
    "ln_2": ("norm2", False),
    "mlp.c_fc": ("ffn.fc1", True),
    "mlp.c_proj": ("ffn.fc2", True),
}
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers in old checkpoints


def config_from_hf(hf: dict[str, Any], source: str) -> DecoderConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS_IN:
        raise LmforgeError(f"{source}: activation_function {act!r} is not supported")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(flag):
            raise LmforgeError(f"{source}: {flag}=true is not supported")
    if hf.get("scale_attn_weights", True) is False:
        raise LmforgeError(f"{source}: scale_attn_weights=false is not supported")
    try:  # lmforge has one dropout rate: resid_pdrop serves for embd_pdrop too
        d = hf["n_embd"]
        config = DecoderConfig(
            vocab_size=hf["vocab_size"], d_model=d, n_layers=hf["n_layer"], n_heads=hf["n_head"],
            d_ff=hf.get("n_inner") or 4 * d, max_positions=hf.get("n_positions", 1024),
            dropout=hf.get("resid_pdrop", 0.1), attention_dropout=hf.get("attn_pdrop", 0.1),
            activation=ACTIVATIONS_IN[act], eps=hf.get("layer_norm_epsilon", 1e-5),
            tie_embeddings=hf.get("tie_word_embeddings", True), pad_id=hf.get("pad_token_id"),
            bos_id=hf.get("bos_token_id"), eos_id=hf.get("eos_token_id"),
        )
    except KeyError as err:
        raise LmforgeError(f"{source}: missing field {err.args[0]!r}") from None
    config.validate(source)
    return config


def config_to_hf(c: DecoderConfig) -> dict[str, Any]:
    changed = c.non_gpt2_settings()
    if changed:  # GPT2LMHeadModel has no place for them: refuse rather than write a model that computes otherwise
        raise LmforgeError(f"cannot export to Hugging Face GPT-2: this Decoder uses non-GPT-2 settings "
                           f"({', '.join(changed)}); only the GPT-2 switches export")
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": c.vocab_size,
        "n_embd": c.d_model, "n_layer": c.n_layers, "n_head": c.n_heads, "n_inner": c.d_ff,
        "n_positions": c.max_positions, "activation_function": ACTIVATIONS_OUT[c.activation],
        "resid_pdrop": c.dropout, "embd_pdrop": c.dropout, "attn_pdrop": c.attention_dropout,
        "layer_norm_epsilon": c.eps, "tie_word_embeddings": c.tie_embeddings, "pad_token_id": c.pad_id,
        "bos_token_id": c.bos_id, "eos_token_id": c.eos_id, "initializer_range": 0.02,
        "scale_attn_weights": True,
    }


def weights_from_hf(state: dict[str, torch.Tensor], n_layers: int, tied: bool, source: str
                    ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF GPT-2 tensors -> lmforge Decoder names; also returns the HF keys left unused."""
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(hf: str, ours: str, transpose: bool = False) -> None:
        if hf in state:
            t = state[hf]
            if transpose:
                if t.dim() != 2:
                    raise LmforgeError(f"{source}: tensor {hf!r} has shape {tuple(t.shape)}, expected a matrix")
                t = t.t().contiguous()  # Conv1D (in, out) -> Linear (out, in)
            out[ours] = t
            used.add(hf)

    take("wte.weight", "tok_emb.weight")
    take("wpe.weight", "pos_emb.embedding.weight")
    for i in range(n_layers):
        for hf, (ours, conv) in LAYER.items():
            take(f"h.{i}.{hf}.weight", f"layers.{i}.{ours}.weight", transpose=conv)
            take(f"h.{i}.{hf}.bias", f"layers.{i}.{ours}.bias")
    take("ln_f.weight", "norm_f.weight")
    take("ln_f.bias", "norm_f.bias")
    if tied:
        used.add("lm_head.weight")  # the same matrix as wte
    else:
        take("lm_head.weight", "lm_head.proj.weight")
    unused = [k for k in state if k not in used and not k.endswith(IGNORED_SUFFIXES)]
    return out, unused


def weights_to_hf(state: dict[str, torch.Tensor], n_layers: int, tied: bool) -> dict[str, torch.Tensor]:
    """lmforge Decoder tensors -> HF GPT2LMHeadModel names (``transformer.`` prefix, Conv1D layout)."""
    out = {"transformer.wte.weight": state["tok_emb.weight"],
           "transformer.wpe.weight": state["pos_emb.embedding.weight"]}
    for i in range(n_layers):
        for hf, (ours, conv) in LAYER.items():
            w = state[f"layers.{i}.{ours}.weight"]
            out[f"transformer.h.{i}.{hf}.weight"] = w.t().contiguous() if conv else w
            out[f"transformer.h.{i}.{hf}.bias"] = state[f"layers.{i}.{ours}.bias"]
    out["transformer.ln_f.weight"] = state["norm_f.weight"]
    out["transformer.ln_f.bias"] = state["norm_f.bias"]
    if not tied:
        out["lm_head.weight"] = state["lm_head.proj.weight"]
    return out
