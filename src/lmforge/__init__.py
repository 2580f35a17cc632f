"""lmforge: build, pretrain, fine-tune and inspect Transformer language models.

The house (docs/architecture.md): the **engine** packages follow the flow of the course —
``reference`` (NumPy equations) → ``tokenizers`` → ``nn`` → ``models`` → ``data`` → ``train`` →
``generation``, with ``interop`` (model directories in and out) and ``viz`` (pictures) beside them;
the **workflows** (``lmforge.workflows``: pretrain, finetune, translate, embed, inspect, demo) compose
the engine into jobs; **cli** (``lmforge.cli``) is the ``lmforge`` command, a thin shell over both.
``errors``, ``files``, ``manifest``, ``lock`` and ``outputs`` are the small base modules every package may use.

``lmforge.load(path)`` returns ``(model, tokenizer)`` for an lmforge model directory, a Hugging Face
BERT / GPT-2 directory, or a fine-tuned adapter output. Heavy imports (torch) happen inside it, so
``import lmforge`` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from lmforge.manifest import VERSION as __version__

if TYPE_CHECKING:
    from torch import nn


def load(path: str | os.PathLike, device: Any = None, tokenizer: bool = True,
         verify: bool | None = None) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a model directory: lmforge's own, a Hugging Face BERT / GPT-2 one, or an adapter.

    The model is in eval mode. The tokenizer is ``None`` when the directory holds no tokenizer file
    (or when ``tokenizer=False``). The files are checked against the directory's ``checksums.json``
    when it has one (``verify=False`` skips that, for huge models). See ``lmforge.interop.directories``.
    """
    from lmforge.interop.directories import load as load_directory

    return load_directory(path, device, tokenizer, verify)


__all__ = ["__version__", "load"]
