"""BERT checkpoints in Hugging Face layout <-> lmforge's Encoder (and its heads).

Names on the Hugging Face side (``bert.`` prefix present or absent, old ``gamma``/``beta`` accepted):

    embeddings.{word,position,token_type}_embeddings   -> embeddings.{tok,pos,type}_emb
    encoder.layer.i.attention.self.{query,key,value}   -> layers.i.self_attn.in_proj   rows [W_q; W_k; W_v]
    encoder.layer.i.attention.output.dense / LayerNorm -> layers.i.self_attn.out_proj / norm1
    encoder.layer.i.intermediate.dense, output.dense   -> layers.i.ffn.fc1, ffn.fc2
    encoder.layer.i.output.LayerNorm                   -> layers.i.norm2
    pooler.dense                                       -> pooler
    cls.predictions.transform.{dense,LayerNorm}, .bias -> mlm.dense, mlm.norm, mlm.decoder.bias
    cls.seq_relationship                               -> nsp.classifier
    classifier                                         -> head.classifier
"""

from __future__ import annotations

from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.models.config import EncoderConfig

ACTIVATIONS_IN = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}
ACTIVATIONS_OUT = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
ARCHITECTURES = {
    "BertModel": "Encoder",
    "BertForPreTraining": "EncoderForPreTraining",
    "BertForMaskedLM": "EncoderForPreTraining",
    "BertForSequenceClassification": "EncoderForSequenceClassification",
    "BertForTokenClassification": "EncoderForTokenClassification",
}
EMBEDDINGS = {
    "word_embeddings.weight": "tok_emb.weight",
    "position_embeddings.weight": "pos_emb.embedding.weight",
    "token_type_embeddings.weight": "type_emb.weight",
    "LayerNorm.weight": "norm.weight",
    "LayerNorm.bias": "norm.bias",
}
LAYER = {  # HF name inside encoder.layer.i -> ours inside layers.i (query/key/value handled apart)
    "attention.output.dense": "self_attn.out_proj",
    "attention.output.LayerNorm": "norm1",
    "intermediate.dense": "ffn.fc1",
    "output.dense": "ffn.fc2",
    "output.LayerNorm": "norm2",
}
HEADS = {  # HF -> ours, relative to the head model (the encoder sits under "encoder.")
    "cls.predictions.transform.dense.weight": "mlm.dense.weight",
    "cls.predictions.transform.dense.bias": "mlm.dense.bias",
    "cls.predictions.transform.LayerNorm.weight": "mlm.norm.weight",
    "cls.predictions.transform.LayerNorm.bias": "mlm.norm.bias",
    "cls.predictions.bias": "mlm.decoder.bias",
    "cls.seq_relationship.weight": "nsp.classifier.weight",
    "cls.seq_relationship.bias": "nsp.classifier.bias",
    "classifier.weight": "head.classifier.weight",
    "classifier.bias": "head.classifier.bias",
}
IGNORED = ("embeddings.position_ids", "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def config_from_hf(hf: dict[str, Any], source: str) -> EncoderConfig:
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS_IN:
        raise LmforgeError(f"{source}: hidden_act {act!r} is not supported (use one of {', '.join(ACTIVATIONS_IN)})")
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise LmforgeError(f"{source}: only position_embedding_type 'absolute' is supported")
    try:
        config = EncoderConfig(
            vocab_size=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
            n_heads=hf["num_attention_heads"], d_ff=hf["intermediate_size"],
            max_positions=hf.get("max_position_embeddings", 512), type_vocab_size=hf.get("type_vocab_size", 2),
            dropout=hf.get("hidden_dropout_prob", 0.1), attention_dropout=hf.get("attention_probs_dropout_prob", 0.1),
            activation=ACTIVATIONS_IN[act], eps=hf.get("layer_norm_eps", 1e-12), pad_id=hf.get("pad_token_id", 0),
        )
    except KeyError as err:
        raise LmforgeError(f"{source}: missing field {err.args[0]!r}") from None
    config.validate(source)
    return config


def config_to_hf(c: EncoderConfig, architecture: str, num_labels: int | None = None,
                 labels: list[str] | None = None) -> dict[str, Any]:
    hf_arch = {v: k for k, v in ARCHITECTURES.items() if k != "BertForMaskedLM"}[architecture]
    d = {
        "architectures": [hf_arch], "model_type": "bert", "vocab_size": c.vocab_size, "hidden_size": c.d_model,
        "num_hidden_layers": c.n_layers, "num_attention_heads": c.n_heads, "intermediate_size": c.d_ff,
        "hidden_act": ACTIVATIONS_OUT[c.activation], "hidden_dropout_prob": c.dropout,
        "attention_probs_dropout_prob": c.attention_dropout, "max_position_embeddings": c.max_positions,
        "type_vocab_size": c.type_vocab_size, "layer_norm_eps": c.eps, "pad_token_id": c.pad_id,
        "position_embedding_type": "absolute", "initializer_range": 0.02, "tie_word_embeddings": True,
    }
    if num_labels:
        names = list(labels) if labels and len(labels) == num_labels else [f"LABEL_{i}" for i in range(num_labels)]
        d["id2label"] = {str(i): name for i, name in enumerate(names)}  # the fine-tuned label names travel
        d["label2id"] = {name: i for i, name in enumerate(names)}
    return d


def normalise_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop the ``bert.`` prefix and rename old LayerNorm ``gamma``/``beta`` to ``weight``/``bias``."""
    out = {}
    for k, v in state.items():
        k = k.removeprefix("bert.")
        if ".LayerNorm." in k:
            k = k.replace(".gamma", ".weight").replace(".beta", ".bias")
        out[k] = v
    return out


def weights_from_hf(state: dict[str, torch.Tensor], n_layers: int, prefix: str, source: str
                    ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF BERT tensors -> lmforge names (encoder under ``prefix``); also returns unused HF keys."""
    state = normalise_keys(state)
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()

    def take(hf: str, ours: str) -> None:
        if hf in state:
            out[ours] = state[hf]
            used.add(hf)

    for hf, ours in EMBEDDINGS.items():
        take(f"embeddings.{hf}", f"{prefix}embeddings.{ours}")
    for i in range(n_layers):
        src, dst = f"encoder.layer.{i}.", f"{prefix}layers.{i}."
        for kind in ("weight", "bias"):
            qkv = [f"{src}attention.self.{p}.{kind}" for p in ("query", "key", "value")]
            if all(k in state for k in qkv):
                out[f"{dst}self_attn.in_proj.{kind}"] = torch.cat([state[k] for k in qkv], dim=0)
                used.update(qkv)
            elif any(k in state for k in qkv):
                missing = next(k for k in qkv if k not in state)
                raise LmforgeError(f"{source}: tensor {missing!r} is missing")
            for hf, ours in LAYER.items():
                take(f"{src}{hf}.{kind}", f"{dst}{ours}.{kind}")
    take("pooler.dense.weight", f"{prefix}pooler.weight")
    take("pooler.dense.bias", f"{prefix}pooler.bias")
    for hf, ours in HEADS.items():
        take(hf, ours)
    if "mlm.decoder.bias" not in out and "cls.predictions.decoder.bias" in state:
        out["mlm.decoder.bias"] = state["cls.predictions.decoder.bias"]
    unused = [k for k in state if k not in used and not k.startswith(IGNORED)]
    return out, unused


def weights_to_hf(state: dict[str, torch.Tensor], n_layers: int, prefix: str) -> dict[str, torch.Tensor]:
    """lmforge tensors (encoder under ``prefix``) -> HF BERT names, ``bert.`` prefixed when heads exist."""
    hf_prefix = "bert." if prefix else ""
    out: dict[str, torch.Tensor] = {}
    for hf, ours in EMBEDDINGS.items():
        out[f"{hf_prefix}embeddings.{hf}"] = state[f"{prefix}embeddings.{ours}"]
    for i in range(n_layers):
        src, dst = f"{prefix}layers.{i}.", f"{hf_prefix}encoder.layer.{i}."
        for kind in ("weight", "bias"):
            q, k, v = state[f"{src}self_attn.in_proj.{kind}"].chunk(3, dim=0)
            for name, t in (("query", q), ("key", k), ("value", v)):
                out[f"{dst}attention.self.{name}.{kind}"] = t.clone()
            for hf, ours in LAYER.items():
                out[f"{dst}{hf}.{kind}"] = state[f"{src}{ours}.{kind}"]
    out[f"{hf_prefix}pooler.dense.weight"] = state[f"{prefix}pooler.weight"]
    out[f"{hf_prefix}pooler.dense.bias"] = state[f"{prefix}pooler.bias"]
    for hf, ours in HEADS.items():
        if ours in state:
            out[hf] = state[ours]
    if "mlm.decoder.bias" in state:
        out["cls.predictions.decoder.bias"] = state["mlm.decoder.bias"].clone()
    return out
