"""Checkpoints that survive a crash at any instant: write everything, then rename.

Layout of a run directory::

    run_dir/
      config.yaml                    the resolved recipe
      log.jsonl, loss.png            the logs (see ``lmforge.train.logs``)
      checkpoints/
        latest                       one line, "step-000300": the newest complete checkpoint
        step-000200/
        step-000300/
          model.safetensors          the weights (a tied tensor stored once)
          optimizer.pt               AdamW moments (+ the fp16 GradScaler), plain tensors and numbers
          trainer.json               step, tokens seen, best evaluation, RNG states, threads and device
          config.json                the model's config and the path of its tokenizer: a model directory
                                     (``lmforge generate --model RUN/checkpoints/step-000300``)
          checksums.json             sha256 of each file above, written last (``lmforge.manifest``)

A checkpoint is first written to ``checkpoints/.tmp-step-000300-<pid>/``, each file flushed to disk,
then renamed to ``step-000300`` in one ``os.replace``; only then is ``latest`` replaced (also write +
rename). A process killed at any point leaves either the old checkpoint or the new one, complete; a
leftover ``.tmp-*`` directory is ignored and removed at the next start. A full disk is one line naming
the directory and the size the checkpoint needed; the previous checkpoint stays intact.

Resume takes the newest checkpoint that verifies (its checksums, a readable safetensors header, a
readable ``trainer.json``) and says which newer ones it skipped and why: a checkpoint truncated or
corrupted on disk or in a copy is never trained on.

Everything loads without unpickling code: safetensors for the weights, ``torch.load(weights_only=True)``
for the optimizer, JSON for the rest (RNG states as base64 or integer lists).
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from lmforge.errors import LmforgeError
from lmforge.files import disk_full, move, remove_tree, will_write, write_text_atomic
from lmforge.manifest import MANIFEST_NAME, verify_manifest, write_manifest
from lmforge.models.registry import load_tensors_only, untied
from lmforge.train.logs import info

STEP_PREFIX = "step-"
OPTIMIZER_HINT = "lmforge writes optimizer states as plain tensors: this file was replaced; delete the checkpoint"


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:06d}"


@dataclass
class Checkpoint:
    """A loaded checkpoint: where it is, its step, and the trainer's JSON state."""

    path: Path
    step: int
    state: dict[str, Any]

    def weights(self, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
        path = self.path / "model.safetensors"
        try:
            return load_file(path, device=str(device))
        except (SafetensorError, OSError) as err:
            raise LmforgeError(f"{path}: unreadable weights ({str(err).splitlines()[0]})") from None

    def optimizer(self) -> dict[str, Any]:
        return load_tensors_only(self.path / "optimizer.pt", OPTIMIZER_HINT)


# ---------------------------------------------------------------------------------------------- the checkpoint

def checkpoint_config(model: torch.nn.Module, tokenizer_dir: str | Path | None = None,
                      extra: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """A checkpoint's config.json: the model's config, architecture, tokenizer directory and ``extra``.

    None when the model has no lmforge config, or carries LoRA / adapter / mix parameters (their weights
    are not those of the plain architecture: ``lmforge finetune`` writes their own directories).
    """
    from lmforge.nn.lora import is_delta_parameter

    config = getattr(model, "config", None)
    names = [n for n, _ in model.named_parameters()]
    if not hasattr(config, "to_dict") or any(is_delta_parameter(n) or n.startswith("mix.") for n in names):
        return None
    card = {**config.to_dict(), "architecture": type(model).__name__, **(extra or {})}
    if getattr(model, "num_labels", None):
        card["num_labels"] = model.num_labels
    if tokenizer_dir is not None:
        card["tokenizer"] = str(tokenizer_dir)
    return card


def hardware(device: torch.device) -> dict[str, Any]:
    """What bit-identical resumption needs to be the same: CPU threads and the device type."""
    return {"threads": torch.get_num_threads(), "device": device.type}


def warn_other_hardware(state: dict[str, Any], device: torch.device) -> None:
    """One line when a checkpoint was saved with another thread count or device than this process has."""
    differs = [f"{k} {state[k]} -> {v}" for k, v in hardware(device).items() if k in state and state[k] != v]
    if differs:
        info(f"resuming with other settings than the checkpoint's ({', '.join(differs)}): training goes on, but "
             "not bit-identical to an uninterrupted run (give the same --threads and --device for that)")


# ---------------------------------------------------------------------------------------------- RNG

def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA). Build the model after this for a reproducible init."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng() -> dict[str, Any]:
    """The state of every random generator a step can touch, as JSON-safe values."""
    py_version, py_state, py_gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": {"version": py_version, "state": list(py_state), "gauss_next": py_gauss},
        "numpy": {"kind": np_kind, "keys": np_keys.tolist(), "pos": int(np_pos),
                  "has_gauss": int(np_has_gauss), "cached_gaussian": float(np_gauss)},
        "torch": _b64(torch.get_rng_state()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [_b64(s) for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    n = state["numpy"]
    np.random.set_state((n["kind"], np.array(n["keys"], dtype=np.uint32), n["pos"], n["has_gauss"],
                         n["cached_gaussian"]))
    torch.set_rng_state(_unb64(state["torch"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([_unb64(s) for s in state["cuda"]])


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.cpu().numpy().tobytes()).decode("ascii")


def _unb64(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)


# ---------------------------------------------------------------------------------------------- save / load

def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(
    run_dir: Path,
    step: int,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    keep_last: int = 0,
    model_config: dict[str, Any] | None = None,
) -> Path:
    """Write ``checkpoints/step-XXXXXX`` atomically, point ``latest`` at it, prune old ones; return its path.

    model_config: the ``config.json`` that makes the checkpoint a model directory; a ``tokenizer`` entry
    (a directory) is stored relative to the checkpoint, so a run directory can be moved whole.
    """
    root = checkpoints_dir(run_dir)
    final = root / step_name(step)
    tmp = root / f".tmp-{step_name(step)}-{os.getpid()}"
    names = [*CHECKPOINT_FILES, *(["config.json"] if model_config is not None else []), MANIFEST_NAME]
    will_write(*(tmp / name for name in names))  # before the folder exists: a claimed output lists them
    root.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        save_file(untied(weights), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        torch.save(optimizer_state, tmp / "optimizer.pt")
        # atomic: everything here goes into a temporary folder that is renamed into place as a whole
        (tmp / "trainer.json").write_text(json.dumps({"step": step, **trainer_state}) + "\n", encoding="utf-8")
        if model_config is not None:
            card = dict(model_config)
            if card.get("tokenizer"):
                card["tokenizer"] = os.path.relpath(Path(card["tokenizer"]).resolve(), final.resolve())
            (tmp / "config.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")  # atomic: ditto
        write_manifest(tmp)
    except (OSError, RuntimeError, SafetensorError) as err:  # torch.save reports a full disk as RuntimeError
        remove_tree(tmp)
        need = _state_bytes(weights) + _state_bytes(optimizer_state)
        if not (disk_full(err) or shutil.disk_usage(root).free < need):
            raise
        raise LmforgeError(f"{root}: no space left on the device while saving {step_name(step)} (it needs about "
                           f"{need / 2**20:.1f} MiB); free space or lower train.keep_last; the previous "
                           "checkpoint is intact") from None
    for f in tmp.iterdir():
        _fsync(f)
    if final.exists():  # re-saving a step after a resume: move the old copy aside first
        old = root / f".old-{step_name(step)}-{os.getpid()}"
        move(final, old)
        move(tmp, final)
        remove_tree(old)
    else:
        move(tmp, final)
    _fsync(root)
    write_text_atomic(root / "latest", final.name + "\n")
    if keep_last:
        prune(root, keep_last, keep=final.name)
    return final


def prune(root: Path, keep_last: int, keep: str) -> None:
    """Delete all but the ``keep_last`` newest step directories (never ``keep``, the one ``latest`` names)."""
    steps = sorted(p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir())
    for p in steps[:-keep_last]:
        if p.name != keep:
            remove_tree(p)


def _state_bytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state: what a checkpoint of it takes on disk, about."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(_state_bytes(v) for v in state)
    return 0


CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "trainer.json")


def verify_checkpoint(path: Path) -> None:
    """Raise an LmforgeError naming the file when ``path`` is not a complete, intact checkpoint.

    Its checksums when it has a manifest (``--no-verify`` skips them); in any case the safetensors header
    must match the file's size (a truncated copy fails here) and ``trainer.json`` must parse.
    """
    for name in CHECKPOINT_FILES:
        if not (path / name).is_file():
            raise LmforgeError(f"{path / name}: missing (an incomplete checkpoint)")
    verify_manifest(path, required=CHECKPOINT_FILES, lmforge_written=True)  # lmforge always writes one here
    try:
        with safe_open(str(path / "model.safetensors"), framework="pt"):
            pass
    except (SafetensorError, OSError) as err:
        raise LmforgeError(f"{path / 'model.safetensors'}: unreadable ({str(err).splitlines()[0]})") from None
    read_checkpoint(path)


def latest_checkpoint(run_dir: Path, clean: bool = False, verify: bool = False) -> Checkpoint | None:
    """The checkpoint ``latest`` names (or, if that file is gone, the newest complete one); None if none.

    clean: also delete what an interrupted save left (``.tmp-*`` / ``.old-*`` directories).
    verify: take the newest checkpoint that passes ``verify_checkpoint``, saying which were skipped and why;
    when checkpoints exist and none passes, an ``LmforgeError`` (not a silent start from step 0).
    """
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return None
    if clean:
        for stale in [*root.glob(".tmp-*"), *root.glob(".old-*")]:
            remove_tree(stale)
    pointer = root / "latest"
    candidates = []
    if pointer.is_file():
        candidates.append(root / pointer.read_text(encoding="utf-8").strip())
    candidates += sorted((p for p in root.glob(f"{STEP_PREFIX}*") if p.is_dir()), reverse=True)
    seen, skipped = set(), []
    for path in candidates:
        if path in seen:
            continue
        seen.add(path)
        if not verify:
            if (path / "trainer.json").is_file() and (path / "model.safetensors").is_file():
                return read_checkpoint(path)
            continue
        try:
            verify_checkpoint(path)
        except LmforgeError as err:
            info(f"skipping checkpoint {path.name}: {err}")
            skipped.append(path.name)
            continue
        return read_checkpoint(path)
    if skipped:  # starting over would replace the run's log and its work: the user decides
        raise LmforgeError(f"{root}: none of its {len(skipped)} checkpoints verifies (see above), so the run cannot "
                           "resume; move the folder away to start over, or resume unverified with --no-verify")
    return None


def read_checkpoint(path: Path) -> Checkpoint:
    try:
        state = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
        step = int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LmforgeError(f"{path / 'trainer.json'}: unreadable checkpoint state: {err}") from None
    return Checkpoint(path=path, step=step, state=state)


def _fsync(path: Path) -> None:
    """Flush a file (or a directory entry) to disk, so that a power cut after the rename keeps the data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems do not fsync directories
    finally:
        os.close(fd)
