"""lmforge: build, pretrain, fine-tune, inspect and serve Transformer language models.

The house (docs/architecture.md): the **engine** packages follow the flow of the course, the **workflows**
compose them into jobs, and two thin shells sit on top, the command line and the HTTP server:

    reference/    NumPy float64 equations: the oracle every torch module is tested against
    tokenizers/   BPE, byte-level BPE, WordPiece; tokenizer.json in and out; chat templates (no torch)
    nn/           building blocks: one attention, one Transformer layer, positions, norms, LSTM, LoRA
    models/       Encoder (BERT), Decoder (GPT-2 and its modern switches), Seq2Seq, heads, ELMo, RNN, CNN, ...
    data/         corpus shards, pretraining objectives, labeled and chat tasks, real-data sources
    train/        the training loop: optimizers, schedules, atomic checkpoints, exact resume, DDP / FSDP
    generation/   decoding: next-token scores to text, one request or many at once (the decoding engine)
    interop/      model directories in and out: Hugging Face BERT / GPT-2 / Llama, PEFT, GGUF
    viz/          pictures: attention heatmaps, the HTML explorer, loss curves, confusion matrices
    workflows/    the jobs: pretrain, finetune, sft, translate, embed, inspect, chat, evaluate, convert, serve
    serve/        ``lmforge serve``'s HTTP shell: OpenAI-shaped routes over ``workflows.serving``
    cli/          the ``lmforge`` command: one module per command group, no logic
    recipes/      the YAML recipes that ``--config NAME`` finds (data, no code)

and the small base modules every package may use (standard library only):

    cores.py      the CPU threads to run on: how many cores other processes keep busy right now
    devices.py    which device to run on (cpu, cuda, cuda:N, mps, auto), checked against the machine
    errors.py     ``LmforgeError``: bad input or state, one line naming the file, line or field at fault
    files.py      files written atomically (never half-written) and text files read with one rule
    manifest.py   ``checksums.json``: the sha256 of every file a directory holds, verified on load
    lock.py       ``RunLock``: one writer per run directory
    outputs.py    outputs claim only what they wrote: a user's file in ``--out`` is never replaced silently
    schema.py     settings declared once: the YAML key, KEY=VALUE, the flag and the check from one field
    workers.py    worker-process pools that leave nothing behind

``lmforge.load(path)`` returns ``(model, tokenizer)`` for an lmforge model directory, a Hugging Face
BERT / GPT-2 / Llama directory, a GGUF file, or a fine-tuned adapter output. Heavy imports (torch) happen inside
it, so ``import lmforge`` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lmforge.manifest import VERSION as __version__

if TYPE_CHECKING:
    from torch import nn


def load(path: str | os.PathLike, device: Any = None, tokenizer: bool = True,
         verify: bool | None = None, dtype: str | None = None, group_size: int = 32) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a model directory: lmforge's own, a Hugging Face BERT / GPT-2 one, or an adapter.

    The model is in eval mode. The tokenizer is ``None`` when the directory holds no tokenizer file
    (or when ``tokenizer=False``). The files are checked against the directory's ``checksums.json``
    when it has one (``verify=False`` skips that, for huge models). ``dtype``: None (as read: float32), fp32,
    bf16, fp16, or int8 / int4 (weight-only quantized linear layers on the CPU, ``lmforge.nn.quant``;
    ``group_size`` their groups). See ``lmforge.interop.directories``.
    """
    from lmforge.interop.directories import load as load_directory

    return load_directory(path, device, tokenizer, verify, dtype, group_size)


__all__ = ["__version__", "load"]
