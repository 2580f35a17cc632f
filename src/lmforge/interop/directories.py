"""Model directories in and out: any directory ``lmforge.load`` reads, and the outputs of fine-tuning.

    lmforge's own        config.json + model.safetensors (+ tokenizer.json)       models.registry
    Hugging Face         a BERT / GPT-2 folder (config.json with model_type)      interop.huggingface
    adapter output       adapter_config.json + adapter.safetensors: the base model is read from its own
                         directory, wrapped as in training (models.strategies), the trained tensors loaded
                         and LoRA merged

``save_finetuned`` writes either kind of fine-tuning output; ``load_finetuned`` rebuilds it with its task
and label names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import nn

from lmforge.cores import fitting_threads, machine
from lmforge.errors import LmforgeError
from lmforge.manifest import verify_manifest, write_manifest
from lmforge.models.strategies import StrategySpec, apply_strategy, task_model
from lmforge.models.unwritten import return_freed_memory
from lmforge.nn.lora import LORA_TARGETS

ADAPTER_FILE, ADAPTER_CONFIG = "adapter.safetensors", "adapter_config.json"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # what lmforge.tokenizers.load_tokenizer reads
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", ADAPTER_FILE, ADAPTER_CONFIG, "config.json",
                "tokenizer.json", "vocab.txt")  # a manifest must list each of these that the directory holds


def written_by_lmforge(folder: Path) -> bool:
    """config.json names the lmforge version that wrote it, or an lmforge adapter is there: either way a
    checksums.json was written beside it."""
    if (folder / ADAPTER_FILE).is_file():
        return True
    try:
        return "lmforge_version" in json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def verify_directory(folder: Path, verify: bool | None = None) -> bool:
    """The check before anything reads a model directory (load, fine-tuned outputs, every convert): each file its
    manifest lists, by size and sha256. lmforge's own directories must have one that lists every model file;
    someone else's (a Hugging Face folder, perhaps with an lmforge tokenizer saved into it) are vouched for as
    far as a manifest goes, the rest checked as their formats are read. False when there is no manifest."""
    ours = written_by_lmforge(folder)  # either way a tokenizer file beside a manifest must be listed in it (the
    # tokenizer is then not hashed a second time when it is read)
    from lmforge.tokenizers.chat import TEMPLATE_FILES

    required = (*(WEIGHT_FILES if ours else TOKENIZER_FILES), *TEMPLATE_FILES)  # a chat template is code
    return verify_manifest(folder, required=required, verify=verify, lmforge_written=ours)


def has_tokenizer(folder: str | os.PathLike) -> bool:
    return any((Path(folder) / name).exists() for name in TOKENIZER_FILES)


def load(path: str | os.PathLike, device: Any = None, tokenizer: bool = True,
         verify: bool | None = None, dtype: str | None = None, group_size: int = 32) -> tuple[nn.Module, Any]:
    """(model in eval mode, tokenizer or None) from any model directory (see ``read_model``). A load makes some
    300,000 Python objects (a vocabulary, its merges, the ranks table) and no garbage: the collector's passes over
    them were a quarter of SmolLM2's load, so it pauses meanwhile; the heap the load freed goes back after."""
    import gc

    machine()  # the first look at the other processes' load (``with_dtype`` asks it)
    paused = gc.isenabled()
    gc.disable()
    try:
        model, tok = read_model(path, device, tokenizer, verify, dtype, group_size)
    finally:
        if paused:
            gc.enable()
    return_freed_memory()
    return model, tok


def read_model(path: str | os.PathLike, device: Any = None, tokenizer: bool = True,
               verify: bool | None = None, dtype: str | None = None, group_size: int = 32) -> tuple[nn.Module, Any]:
    """(model in eval mode, tokenizer or None) from any model directory (see the module docstring).

    dtype: the weights once loaded (``with_dtype``; None: as read, float32); a GGUF file's Q4_0 / Q4_1
    matrices go straight into int4 layers with ``dtype="int4"`` (and the default group of 32, its blocks).

    verify: check the files against the directory's ``checksums.json`` first (default: yes, unless
    ``--no-verify``); a directory without one (Hugging Face, older lmforge) loads unverified. A
    checkpoint folder (``RUN/checkpoints/step-N``) finds its tokenizer through config.json's ``tokenizer``.
    """
    from lmforge.devices import resolve_device
    from lmforge.interop.huggingface import is_hf_dir, load_hf
    from lmforge.models.config import read_json
    from lmforge.models.registry import load_pretrained

    folder = Path(path)
    device = resolve_device(device, "device") if device is not None else None
    if folder.is_file() and folder.suffix == ".gguf":  # llama.cpp's one file: checked by its own sizes
        from lmforge.interop.gguf import load_gguf
        from lmforge.train.logs import info

        info(f"{folder}: a GGUF file carries no checksums; every size it declares is checked against the file "
             "and the model it describes")
        check_dtype(dtype, device)
        model, tok = load_gguf(folder, dtype, group_size, tokenizer)
        return with_dtype(model.to(device) if device is not None else model, dtype, group_size), tok
    if not folder.is_dir():
        raise LmforgeError(f"{folder}: not a model directory (nor a .gguf file)")
    check_dtype(dtype, device)
    verified = verify_directory(folder, verify)
    if (folder / ADAPTER_CONFIG).is_file():  # LoRA / adapter output of `lmforge finetune`
        model, tok, _ = load_finetuned(folder, device, verify=False)  # verified above
        return with_dtype(model, dtype, group_size), tok
    if not (folder / "config.json").exists():
        raise LmforgeError(f"{folder}: no config.json (not a model directory)")
    model = load_hf(folder, device) if is_hf_dir(folder) else load_pretrained(folder, device)
    tok = None
    where = folder
    if not has_tokenizer(folder) and isinstance(ref := read_json(folder / "config.json").get("tokenizer"), str):
        where = folder / ref  # a checkpoint points at its run's tokenizer
    if tokenizer and has_tokenizer(where):
        from lmforge.tokenizers import load_tokenizer

        # a run's (outside the folder): checked against its own manifest, which it always has; the folder's own
        # tokenizer files were hashed with the folder just above
        tok = load_tokenizer(where, False if verified and where == folder else verify,
                             manifest_required=where != folder)
        check_vocabulary(tok, model, where)
    model = with_dtype(model, dtype, group_size)
    if dtype in QUANTIZED:  # the float parameters left (embeddings, norms) still view the mapped file, all of whose
        for p in model.parameters():  # pages quantizing has read: copied out, the mapping goes, and those pages
            p.data = p.data.clone()  # with it (513 MiB of SmolLM2 otherwise stays resident beside its int4 layers)
    return model, tok


QUANTIZED = ("int8", "int4")


def check_dtype(dtype: str, device: Any) -> None:
    """int8 / int4 run on torch's CPU kernels only: one line before anything is read otherwise."""
    if dtype in QUANTIZED and device is not None and getattr(device, "type", str(device)) != "cpu":
        raise LmforgeError(f"--dtype {dtype}: quantized weights run on the CPU only (torch's CPU kernels); use "
                           "--device cpu, or --dtype bf16 on a GPU")


def with_dtype(model: nn.Module, dtype: str | None, group_size: int = 32) -> nn.Module:
    """``model`` in ``dtype`` (None: as it is): fp32 / bf16 / fp16 cast; int8 / int4 its float ``nn.Linear``
    layers quantized in place (``nn.quant.quantize``; activations and everything else as they were: float32
    from every loader), those the kernels cannot hold named on standard error."""
    import torch

    from lmforge.nn.quant import quantize

    if dtype is None:
        return model
    if dtype not in QUANTIZED:  # cast only when a parameter differs: a cast also rounds the float64 rotary tables
        target = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        return model.to(target) if any(p.dtype != target for p in model.parameters()) else model
    check_dtype(dtype, next(model.parameters()).device)
    with fitting_threads():  # the threads whose cores other processes left free since the load began
        kept = quantize(model, dtype, group_size)
    if kept:
        from lmforge.train.logs import info

        info(f"--dtype {dtype}: {len(kept)} layer(s) stay float32: {', '.join(kept[:3])}"
             f"{' ...' if len(kept) > 3 else ''}")
    return model

def check_vocabulary(tok: Any, model: nn.Module, where: Path) -> None:
    """A tokenizer with ids the model has no embedding row for is refused (it would fail, or read garbage,
    at the first such id); a smaller one is fine (a padded vocabulary)."""
    rows = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(rows, int) and tok.vocab_size > rows:
        raise LmforgeError(f"{where}: the tokenizer has {tok.vocab_size} tokens but the model only {rows} "
                           "embedding rows: they do not belong together")


def load_tokenizer_for(model_dir: str | Path, config: Any, tokenizer_dir: str | Path | None = None):
    """The model's tokenizer (or ``tokenizer_dir``'s), checked against the model's vocabulary."""
    from lmforge.tokenizers import load_tokenizer

    where = Path(tokenizer_dir or model_dir)
    if not has_tokenizer(where):
        raise LmforgeError(f"{where}: no tokenizer (tokenizer.json or vocab.txt)")
    tok = load_tokenizer(where)
    if tok.vocab_size != config.vocab_size:
        raise LmforgeError(f"{where}: the tokenizer has {tok.vocab_size} tokens but the model {model_dir} "
                           f"expects vocab_size {config.vocab_size}: tokenizer and model do not match")
    if tok.pad_id is None:
        raise LmforgeError(f"{where}: the tokenizer has no padding token")
    return tok


def build_task_model(model_dir: str | Path, task: str, num_labels: int, tokenizer_dir: str | Path | None = None):
    """(task model with a fresh head, tokenizer): the backbone of ``model_dir`` under a classification head."""
    from lmforge.models.strategies import backbone_config

    base, _ = load(model_dir, tokenizer=False)
    try:
        model = task_model(base, task, num_labels)
    except LmforgeError as err:
        raise LmforgeError(f"{model_dir}: {err}") from None
    return model, load_tokenizer_for(model_dir, backbone_config(model), tokenizer_dir)


MODEL_WEIGHTS = ("model.safetensors", "pytorch_model.bin")  # the weights file of a full model directory


def weights_sha256(model_dir: Path) -> str | None:
    """sha256 of a model directory's weights file: what an adapter was trained on top of."""
    from lmforge.files import sha256_file

    if model_dir.is_file():  # a .gguf base: the file is the weights
        return sha256_file(model_dir)
    found = next((model_dir / n for n in MODEL_WEIGHTS if (model_dir / n).is_file()), None)
    return sha256_file(found) if found else None


def find_base_model(folder: Path, info: dict[str, Any]) -> Path:
    """The base model an adapter directory names: as given (absolute, or relative to the working directory),
    else relative to the adapter directory (both moved together); checked against its recorded sha256."""
    given = Path(info["base_model"])
    candidates = [given]
    if "base_model_relative" in info or not given.is_absolute():
        candidates.append(folder / info.get("base_model_relative", given))
    base = next((c for c in candidates if (c / "config.json").is_file() or (c.is_file() and c.suffix == ".gguf")),
                None)
    if base is None:
        tried = " or ".join(str(c) for c in candidates)
        raise LmforgeError(f"{folder / ADAPTER_CONFIG}: base_model {str(given)!r} not found (tried {tried}); put "
                           "the base model there or edit base_model in that file")
    expected = info.get("base_model_sha256")
    if expected and weights_sha256(base) != expected:
        raise LmforgeError(f"{folder / ADAPTER_CONFIG}: the base model at {base} is not the one this adapter was "
                           "trained on (its weights' sha256 differs)")
    return base


def save_finetuned(model: nn.Module, tokenizer, out: Path, info: dict[str, Any], merge: bool = False) -> int:
    """Write a fine-tuned model into ``out``; returns the checkpoint's size in bytes.

    full / frozen / merge: a full model directory (config.json with task and labels, model.safetensors,
    tokenizer). lora / adapter / frozen with mix: adapter.safetensors (trained tensors only, head included),
    adapter_config.json and the tokenizer; the base model is read from its own directory at load time.
    """
    from lmforge.files import write_text_atomic
    from lmforge.models.registry import TOKENIZER_OUTPUTS, WEIGHTS_NAME, save_pretrained, save_weights
    from lmforge.nn.lora import remove_wrappers, trainable_state_dict

    out.mkdir(parents=True, exist_ok=True)
    if merge:
        remove_wrappers(model)
    if not merge and (info["strategy"] in ("lora", "adapter") or info["mix"]):
        save_weights(trainable_state_dict(model), out / ADAPTER_FILE)
        base = Path(info["base_model"])
        trained_on = info.get("base_model_sha256") or weights_sha256(base)  # what was loaded, not what is there now
        if weights_sha256(base) != trained_on:
            from lmforge.train.logs import info as log

            log(f"{base}: its weights changed while this fine-tune ran; the adapter records the ones it was "
                "trained on, so it loads only beside those")
        meta = {"format": "lmforge-adapter", "version": 2, **info, "base_model": str(info["base_model"]),
                "base_model_relative": os.path.relpath(base.resolve(), out.resolve()),
                "base_model_sha256": trained_on}
        write_text_atomic(out / ADAPTER_CONFIG, json.dumps(meta, indent=1) + "\n")
        tokenizer.save(out)
        write_manifest(out, [ADAPTER_FILE, ADAPTER_CONFIG, *(n for n in TOKENIZER_OUTPUTS if (out / n).is_file())])
        return (out / ADAPTER_FILE).stat().st_size
    save_pretrained(model, out, tokenizer, extra={"task": info["task"], "labels": list(info["labels"])})
    return (out / WEIGHTS_NAME).stat().st_size


def load_finetuned(path: str | Path, device: str | None = None,
                   verify: bool | None = None) -> tuple[nn.Module, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, info with task and labels) from any fine-tuned directory.

    Adapter-only directories are rebuilt: load the base model, wrap it as in training, load the trained
    tensors, merge LoRA (inference then costs what the base model costs). Full directories load directly;
    a Hugging Face ``BertFor{Sequence,Token}Classification`` folder works too (labels from id2label).
    """
    from lmforge.models.config import read_json
    from lmforge.models.registry import load_weights, read_weights
    from lmforge.nn.lora import merge_lora

    folder = Path(path)
    verified = verify_directory(folder, verify)
    if (folder / ADAPTER_CONFIG).is_file():
        info = read_json(folder / ADAPTER_CONFIG)
        for key in ("base_model", "strategy", "task", "labels"):
            if key not in info:
                raise LmforgeError(f"{folder / ADAPTER_CONFIG}: missing field {key!r}")
        lora, adapter = info.get("lora") or {}, info.get("adapter") or {}
        spec = StrategySpec(strategy=info["strategy"], mix=bool(info.get("mix")), lora_r=lora.get("r", 8),
                            lora_alpha=lora.get("alpha", 16.0), lora_targets=lora.get("targets", list(LORA_TARGETS)),
                            adapter_size=adapter.get("size", 64))
        tok_dir = folder if (folder / "tokenizer.json").is_file() else None
        base = find_base_model(folder, info)
        if info["task"] == "chat":  # an instruction-tuned decoder: the base decoder, its LoRA or adapters
            from lmforge.models.strategies import apply_decoder_strategy

            model, tok = load(base)
            if tok_dir is not None:
                from lmforge.tokenizers import load_tokenizer

                tok = load_tokenizer(tok_dir, False if verified else verify)  # hashed with the folder
            model = apply_decoder_strategy(model, spec)
        else:
            model, tok = build_task_model(base, info["task"], len(info["labels"]), tok_dir)
            model = apply_strategy(model, spec)
        tensors = read_weights(folder / ADAPTER_FILE)
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        missing = sorted(trained - set(tensors))
        if missing:
            raise LmforgeError(f"{folder / ADAPTER_FILE}: missing tensor {missing[0]!r} for this {spec.strategy} model")
        load_weights(model, tensors, str(folder / ADAPTER_FILE), optional=("",))
        merge_lora(model)
    else:
        model, tok = load(folder, verify=False)  # verified above
        if tok is None:
            raise LmforgeError(f"{folder}: no tokenizer (tokenizer.json or vocab.txt)")
        info = finetuned_info(folder, model)
    if device is not None:
        model.to(device)
    return model.eval(), tok, info


def finetuned_info(path: str | Path, model: nn.Module) -> dict[str, Any]:
    """Task, label names and max_len of a fine-tuned directory whose ``model`` is already loaded: from
    adapter_config.json, else from config.json (lmforge's ``labels`` or Hugging Face's ``id2label``)."""
    from lmforge.models.config import read_json

    folder = Path(path)
    if (folder / ADAPTER_CONFIG).is_file():
        return read_json(folder / ADAPTER_CONFIG)
    kind = type(model).__name__
    if "Classification" not in kind:
        raise LmforgeError(f"{folder}: the {kind} in it has no classification head; fine-tune it first "
                           "(lmforge finetune --model DIR ...)")
    data = read_json(folder / "config.json")
    id2label = data.get("id2label") or {}
    names = data.get("labels") or [id2label.get(str(i), f"LABEL_{i}") for i in range(model.num_labels)]
    return {"task": "seq-cls" if "Sequence" in kind else "token-cls", "labels": list(names),
            "max_len": model.config.max_positions}


def read_lora(folder: Path, base_sha256: str | None) -> tuple[float, dict[str, tuple[Any, Any]]]:
    """(alpha / r, by layer name (A (r, in), B (out, r))) of a LoRA directory that ``finetune --task chat
    --strategy lora`` wrote, for serving beside its base (``serve --adapter``): verified like every read, and
    refused in one line unless it is a chat LoRA of the base whose weights' sha256 is ``base_sha256``, holding
    LoRA tensors only (a trained head or embedding would change the base for every request)."""
    from lmforge.models.config import read_json
    from lmforge.models.registry import read_weights

    if not (folder / ADAPTER_CONFIG).is_file():
        raise LmforgeError(f"--adapter {folder}: no {ADAPTER_CONFIG} (a directory of `lmforge finetune --task chat "
                           "--strategy lora`)")
    verify_directory(folder)
    info = read_json(folder / ADAPTER_CONFIG)
    where = folder / ADAPTER_CONFIG
    if info.get("task") != "chat" or info.get("strategy") != "lora" or info.get("mix"):
        raise LmforgeError(f"--adapter {where}: task {info.get('task')!r}, strategy {info.get('strategy')!r}; "
                           "only LoRA adapters of a chat fine-tune are served beside a base (--task chat "
                           "--strategy lora)")
    if info.get("base_model_sha256") != base_sha256:
        raise LmforgeError(f"--adapter {where}: trained on another base model (its base_model_sha256 is not the "
                           f"served --model's weights' sha256); serve it with its own base, {info.get('base_model')}")
    lora = info.get("lora") or {}
    tensors = read_weights(folder / ADAPTER_FILE)
    layers: dict[str, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        layer, _, kind = name.rpartition(".")
        if kind not in ("lora_A", "lora_B"):
            raise LmforgeError(f"--adapter {folder / ADAPTER_FILE}: tensor {name!r} is not a LoRA factor (a trained "
                               "head or embedding cannot be served beside the base: merge it, --merge)")
        layers.setdefault(layer, {})[kind] = tensor
    if not layers or any(len(pair) != 2 for pair in layers.values()):
        raise LmforgeError(f"--adapter {folder / ADAPTER_FILE}: each LoRA layer needs its lora_A and lora_B")
    r = lora.get("r", 8)
    return lora.get("alpha", 16.0) / r, {name: (p["lora_A"], p["lora_B"]) for name, p in layers.items()}
