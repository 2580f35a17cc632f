"""Model directories: build a model from its config, save and load weights, count parameters.

A model directory holds ``config.json`` (the config's fields, plus ``architecture`` and, for
classifiers, ``num_labels``/``labels``), ``model.safetensors`` (tied weights stored once) and the
tokenizer files. Weights are read with safetensors only: loading never unpickles anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.files import atomic_path
from lmforge.manifest import write_manifest
from lmforge.models.captioning import GridCaptioner
from lmforge.models.cnn import CNNForSequenceClassification, SentenceCNN
from lmforge.models.config import Config, config_from_dict, config_path, read_json
from lmforge.models.decoder import Decoder
from lmforge.models.dual_encoder import DualEncoder
from lmforge.models.elmo import BiLM, BiLMForSequenceClassification, BiLMForTokenClassification
from lmforge.models.encoder import (
    Encoder,
    EncoderForPreTraining,
    EncoderForSequenceClassification,
    EncoderForTokenClassification,
)
from lmforge.models.rnn_seq2seq import RNNSeq2Seq
from lmforge.models.seq2seq import Seq2Seq
from lmforge.models.unwritten import assign_weights, unwritten
from lmforge.tokenizers.base import TOKENIZER_OUTPUTS  # the files of a tokenizer in a model directory

ARCHITECTURES: dict[str, type[nn.Module]] = {
    # Transformers
    "Encoder": Encoder,
    "EncoderForPreTraining": EncoderForPreTraining,
    "EncoderForSequenceClassification": EncoderForSequenceClassification,
    "EncoderForTokenClassification": EncoderForTokenClassification,
    "Decoder": Decoder,
    "Seq2Seq": Seq2Seq,
    # the roots: recurrent and convolutional models
    "BiLM": BiLM,
    "BiLMForSequenceClassification": BiLMForSequenceClassification,
    "BiLMForTokenClassification": BiLMForTokenClassification,
    "RNNSeq2Seq": RNNSeq2Seq,
    "SentenceCNN": SentenceCNN,
    "CNNForSequenceClassification": CNNForSequenceClassification,
    # beyond token sequences
    "GridCaptioner": GridCaptioner,
    "DualEncoder": DualEncoder,
}
DEFAULT_ARCHITECTURE = {  # config kind -> the base model built when no architecture is named
    "encoder": "Encoder",
    "decoder": "Decoder",
    "seq2seq": "Seq2Seq",
    "bilm": "BiLM",
    "rnn-seq2seq": "RNNSeq2Seq",
    "cnn": "SentenceCNN",
    "grid-captioner": "GridCaptioner",
    "dual-encoder": "DualEncoder",
}
WEIGHTS_NAME = "model.safetensors"


def build_model(config: Config, architecture: str | None = None, num_labels: int | None = None) -> nn.Module:
    """A freshly initialised model of ``architecture`` (default: the config kind's base model)."""
    name = architecture or DEFAULT_ARCHITECTURE[config.kind]
    if name not in ARCHITECTURES:
        raise LmforgeError(f"unknown architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    cls = ARCHITECTURES[name]
    if "Classification" in name:
        if not num_labels:
            raise LmforgeError(f"architecture {name} needs num_labels in config.json")
        return cls(config, num_labels)
    return cls(config)


def tied_aliases(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """{alias: owner} for the names of a state dict whose tensor is an earlier name's (a tied LM head).

    >>> w = torch.zeros(4, 2)   # an embedding that the LM head reuses
    >>> tied_aliases({"embed.weight": w, "head.weight": w, "norm.weight": torch.ones(2)})
    {'head.weight': 'embed.weight'}

    Computed from storage, so it works on any state dict (a model's, or the trainer's on the CPU); FSDP's
    gathered state dict holds tied weights as separate copies, so the trainer asks the plain model.
    """
    owners: dict[tuple, str] = {}
    aliases = {}
    for name, t in state.items():
        key = (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride())
        if t.numel() and key in owners:
            aliases[name] = owners[key]
        else:
            owners.setdefault(key, name)
    return aliases


def untied(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict with each shared tensor kept once, contiguous (safetensors refuses aliases); the file is
    then exactly what ``safetensors.torch.save_model`` writes."""
    aliases = tied_aliases(state)
    return {k: v.detach().contiguous() for k, v in state.items() if k not in aliases}


def state_dict_untied(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with each tied tensor stored once, contiguous, on the CPU."""
    return {k: v.cpu() for k, v in untied(model.state_dict()).items()}


def save_weights(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically (temporary file beside it, then rename)."""
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", **(metadata or {})})


def save_pretrained(model: nn.Module, directory: str | os.PathLike, tokenizer: Any = None,
                    extra: dict[str, Any] | None = None) -> Path:
    """Write config.json and model.safetensors (and the tokenizer, if given) into ``directory``."""
    out = Path(directory)
    from lmforge.nn.quant import layout

    info: dict[str, Any] = {"architecture": type(model).__name__}
    if getattr(model, "num_labels", None):
        info["num_labels"] = model.num_labels
    if layout(model):  # quantized layers: their names and kinds, their tensors in the portable form
        info["quantized"] = layout(model)
    save_weights(state_dict_untied(model), out / WEIGHTS_NAME)
    model.config.save(out, {**info, **(extra or {})})
    if tokenizer is not None:
        tokenizer.save(out)
    write_manifest(out, [n for n in (WEIGHTS_NAME, "config.json", *TOKENIZER_OUTPUTS) if (out / n).is_file()])
    return out


PICKLE_HINT = ("if you trust its source, re-save it as safetensors (transformers: "
               "model.save_pretrained(DIR, safe_serialization=True)), or use the model's model.safetensors")


def load_tensors_only(path: Path, hint: str = PICKLE_HINT) -> Any:
    """``torch.load`` that accepts tensors, numbers and containers only: a pickle carrying other Python
    objects (code that would run on loading) is refused in one line, as is a damaged file."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise LmforgeError(f"{path}: refused: it holds Python objects other than tensors (a pickle that could run "
                           f"code); {hint}") from None
    except (RuntimeError, OSError, EOFError, ValueError) as err:
        raise LmforgeError(f"{path}: cannot read ({str(err).splitlines()[0][:200]})") from None


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, or ``pytorch_model.bin`` read with ``weights_only=True``."""
    if not path.exists():
        raise LmforgeError(f"{path}: no such file")
    if path.suffix != ".safetensors":
        state = load_tensors_only(path)
    else:
        try:
            return load_file(str(path))
        except (SafetensorError, RuntimeError, OSError, ValueError) as err:
            raise LmforgeError(f"{path}: cannot read weights ({str(err).splitlines()[0]})") from None
    if not isinstance(state, dict):
        raise LmforgeError(f"{path}: expected a dict of tensors, got {type(state).__name__}")
    return state


def load_weights(model: nn.Module, tensors: dict[str, torch.Tensor], source: str,
                 optional: tuple[str, ...] = (), assign: bool = False) -> list[str]:
    """Copy ``tensors`` into ``model``, checking names and shapes first; errors name the tensor.

    Tensors whose names start with one of ``optional`` may be absent: they keep their initial values.
    Returns the names of those that were absent. ``assign``: the tensors become the parameters, not copied
    (a model built ``with unwritten()``, whose absent ``optional`` tensors the caller replaces; models/unwritten.py).
    """
    expected = model.state_dict()
    aliases = tied_aliases(expected)
    for name in tensors:
        if name not in expected:
            raise LmforgeError(f"{source}: unexpected tensor {name!r} (not in {type(model).__name__})")
    for name, want in expected.items():  # in the model's order: the first misfit is reported
        value = tensors.get(name)
        if value is not None and tuple(value.shape) != tuple(want.shape):
            raise LmforgeError(
                f"{source}: tensor {name!r} has shape {tuple(value.shape)} but the config expects "
                f"{tuple(want.shape)}"
            )
    absent = [k for k in expected if k not in tensors and k not in aliases]
    missing = [k for k in absent if not k.startswith(optional)] if optional else absent
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise LmforgeError(f"{source}: missing tensor(s) {', '.join(missing[:3])}{more}")
    if assign:
        assign_weights(model, tensors, aliases, expected)
    else:
        model.load_state_dict(tensors, strict=False)
    return [k for k in absent if k not in missing]


def load_pretrained(directory: str | os.PathLike, device: str | torch.device | None = None) -> nn.Module:
    """The model saved by ``save_pretrained`` in ``directory``, in eval mode."""
    folder = Path(directory)
    cfg_file = config_path(folder)
    data = read_json(cfg_file)
    config = config_from_dict(data, str(cfg_file))
    with unwritten():  # every weight comes from the file (or its layer is replaced): none initialised for nothing
        model = build_model(config, data.get("architecture"), data.get("num_labels"))
    weights = folder / WEIGHTS_NAME
    tensors = read_weights(weights)  # memory-mapped: assigned, never copied
    quantized = quantized_layers(data.get("quantized") or {}, tensors, str(cfg_file))
    load_weights(model, tensors, str(weights), optional=tuple(f"{name}." for name in quantized), assign=True)
    for name, layer in quantized.items():  # the float layer (never written) goes, the quantized one comes
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, layer)
    if quantized:
        from lmforge.nn.quant import match_activations, tie_embedding

        tie_embedding(model)  # as ``quantize`` left it: the embedding's rows from the int8 head
        match_activations(model)  # and the int8 head's activations an int4 model's
    if device is not None:
        model.to(device)
    return model.eval()


def quantized_layers(kinds: dict[str, str], tensors: dict[str, torch.Tensor], source: str) -> dict[str, nn.Module]:
    """The quantized layers a directory's config.json names (``"quantized": {layer: kind}``), built from (and
    taken out of) ``tensors``: each layer's ``weight`` and ``scales`` in ``QuantizedLinear.portable``'s form."""
    from lmforge.nn.quant import KINDS, QuantizedLinear

    layers = {}
    for name, kind in kinds.items():
        if kind not in KINDS or f"{name}.weight" not in tensors or f"{name}.scales" not in tensors:
            raise LmforgeError(f"{source}: quantized layer {name!r}: kind {kind!r} or its tensors missing")
        layers[name] = QuantizedLinear.from_portable(kind, tensors.pop(f"{name}.weight"),
                                                     tensors.pop(f"{name}.scales"), tensors.pop(f"{name}.bias", None))
    return layers


def component(name: str) -> str:
    parts = name.split(".")
    if any(p in ("embeddings", "tok_emb", "pos_emb", "type_emb", "embed") for p in parts):
        return "embeddings"
    if any(p in ("layers", "encoder_layers", "decoder_layers", "norm_f") for p in parts):
        return "layers"
    if "pooler" in parts:
        return "pooler"
    return "heads"


def count_parameters(model: nn.Module, by_component: bool = True) -> dict[str, int] | int:
    """Parameters counted once each (tied weights once): a total, or split into components.

    >>> from lmforge.models.config import get_preset
    >>> count_parameters(Encoder(get_preset("bert-base")))["total"]
    109482240
    """
    counts = {"embeddings": 0, "layers": 0, "pooler": 0, "heads": 0}
    for name, p in model.named_parameters():  # duplicates (tied) removed
        counts[component(name)] += p.numel()
    counts["total"] = sum(counts.values())
    return counts if by_component else counts["total"]
