"""A LoRA fine-tune of lmforge, as Hugging Face PEFT and transformers read it, or merged into a plain model.

lmforge puts LoRA on the fused attention projection W_qkv (3D, D) and on W_o. PEFT on BERT puts it on the
separate ``query``, ``key``, ``value`` and ``attention.output.dense`` layers. The update maps exactly:

    ΔW_qkv = (α / r) B A,  B (3D, r)   →   ΔW_q = (α / r) B[0:D] A,  ΔW_k = (α / r) B[D:2D] A,
                                           ΔW_v = (α / r) B[2D:3D] A

(the three share A; PEFT's scaling is also α / r). The trained head is PEFT's ``modules_to_save``
(``classifier``). The base goes with the adapter as a transformers directory (``base/``), so::

    model = BertForSequenceClassification.from_pretrained("out/base")
    model = PeftModel.from_pretrained(model, "out")          # the same logits as lmforge's model
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lmforge.errors import LmforgeError
from lmforge.files import remove_tree, write_text_atomic

PEFT_TARGETS = ["query", "key", "value", "attention.output.dense"]


def lora_to_peft(tensors: dict[str, torch.Tensor], n_layers: int, d_model: int) -> dict[str, torch.Tensor]:
    """lmforge adapter tensors (encoder.layers.i.self_attn.{in,out}_proj.lora_{A,B}, head.classifier.*) ->
    PEFT's names in adapter_model.safetensors."""
    out: dict[str, torch.Tensor] = {}
    for i in range(n_layers):
        ours = f"encoder.layers.{i}.self_attn."
        theirs = f"base_model.model.bert.encoder.layer.{i}.attention."
        a, b = tensors[f"{ours}in_proj.lora_A"], tensors[f"{ours}in_proj.lora_B"]  # (r, D), (3D, r)
        for k, name in enumerate(("query", "key", "value")):
            out[f"{theirs}self.{name}.lora_A.weight"] = a.clone()
            out[f"{theirs}self.{name}.lora_B.weight"] = b[k * d_model:(k + 1) * d_model].clone()
        out[f"{theirs}output.dense.lora_A.weight"] = tensors[f"{ours}out_proj.lora_A"]
        out[f"{theirs}output.dense.lora_B.weight"] = tensors[f"{ours}out_proj.lora_B"]
    for kind in ("weight", "bias"):
        out[f"base_model.model.classifier.{kind}"] = tensors[f"head.classifier.{kind}"]
    return out


def export_peft(adapter_dir: str | Path, out: str | Path) -> Path:
    """Write ``out/adapter_config.json`` + ``out/adapter_model.safetensors`` (PEFT's layout) and the base as a
    transformers directory ``out/base`` (with the label names); returns ``out``."""
    from lmforge.interop.directories import ADAPTER_CONFIG, ADAPTER_FILE, build_task_model, find_base_model
    from lmforge.interop.huggingface import convert_to_hf
    from lmforge.models.config import read_json
    from lmforge.models.registry import load_weights, read_weights, save_pretrained, save_weights

    folder, out = Path(adapter_dir), Path(out)
    if not (folder / ADAPTER_CONFIG).is_file():
        raise LmforgeError(f"{folder}: no {ADAPTER_CONFIG}: --to-peft exports a LoRA output of lmforge finetune")
    info = read_json(folder / ADAPTER_CONFIG)
    if info.get("strategy") != "lora" or info.get("mix"):
        raise LmforgeError(f"{folder / ADAPTER_CONFIG}: strategy {info.get('strategy')!r}: only LoRA exports to "
                           "PEFT (use --merge for a plain model)")
    lora = info.get("lora") or {}
    if sorted(lora.get("targets", [])) != ["*.in_proj", "*.out_proj"]:
        raise LmforgeError(f"{folder / ADAPTER_CONFIG}: LoRA targets {lora.get('targets')}: PEFT export maps the "
                           "default attention targets (*.in_proj, *.out_proj) only")
    tensors = read_weights(folder / ADAPTER_FILE)
    model, tok = build_task_model(find_base_model(folder, info), info["task"], len(info["labels"]),
                                  folder if (folder / "tokenizer.json").is_file() else None)
    config = model.encoder.config
    load_weights(model, {k: v for k, v in tensors.items() if k.startswith("head.")}, str(folder / ADAPTER_FILE),
                 optional=("",))
    labels = list(info["labels"])
    staged = out / "base.lmforge"  # the base + trained head in lmforge's layout, then in transformers'
    save_pretrained(model, staged, tok, extra={"task": info["task"], "labels": labels})
    convert_to_hf(staged, out / "base")
    remove_tree(staged)
    save_weights(lora_to_peft(tensors, config.n_layers, config.d_model), out / "adapter_model.safetensors")
    peft_config: dict[str, Any] = {
        "peft_type": "LORA", "task_type": "SEQ_CLS" if info["task"] == "seq-cls" else "TOKEN_CLS",
        "base_model_name_or_path": str((out / "base").resolve()), "r": int(lora.get("r", 8)),
        "lora_alpha": float(lora.get("alpha", 16.0)), "lora_dropout": float(lora.get("dropout", 0.0)),
        "target_modules": PEFT_TARGETS, "modules_to_save": ["classifier"], "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True, "use_rslora": False,
        "use_dora": False, "revision": None,
    }
    write_text_atomic(out / "adapter_config.json", json.dumps(peft_config, indent=2) + "\n")
    return out


def export_merged(adapter_dir: str | Path, out: str | Path) -> Path:
    """LoRA folded into the weights (or a full fine-tune copied): a plain lmforge model directory with its
    task and label names, which ``lmforge convert --to-hf`` then exports."""
    from lmforge.interop.directories import load_finetuned
    from lmforge.models.registry import save_pretrained
    from lmforge.nn.lora import remove_wrappers

    model, tok, info = load_finetuned(adapter_dir)
    try:
        remove_wrappers(model)
    except ValueError as err:
        raise LmforgeError(f"{adapter_dir}: {err}: adapters stay a separate file") from None
    save_pretrained(model, out, tok, extra={"task": info["task"], "labels": list(info["labels"])})
    return Path(out)
