"""lmforge: build, pretrain, fine-tune and inspect Transformer language models.

The packages follow the flow of the course (see docs/ and DESIGN):
``reference`` (NumPy equations) → ``tokenizers`` → ``nn`` (attention, layers) → ``models`` →
``data`` → ``train`` → fine-tuning, generation and inspection.

``lmforge.load(path)`` returns ``(model, tokenizer)`` for an lmforge model directory or a Hugging Face
BERT / GPT-2 directory. Heavy imports (torch) happen inside it, so ``import lmforge`` stays fast.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from torch import nn

TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")  # what lmforge.tokenizers.load_tokenizer reads


def load(path: str | os.PathLike, device: Any = None, tokenizer: bool = True) -> tuple[nn.Module, Any]:
    """(model, tokenizer) from a model directory: lmforge's own, or a Hugging Face BERT / GPT-2 one.

    The model is in eval mode. The tokenizer is ``None`` when the directory holds no tokenizer file
    (or when ``tokenizer=False``).
    """
    from pathlib import Path

    from lmforge.errors import LmforgeError
    from lmforge.interop.huggingface import is_hf_dir, load_hf
    from lmforge.models.registry import load_pretrained

    folder = Path(path)
    if not folder.is_dir():
        raise LmforgeError(f"{folder}: not a model directory")
    if (folder / "adapter_config.json").is_file():  # LoRA / adapter output of `lmforge finetune`
        from lmforge.finetune import load_finetuned

        model, tok, _ = load_finetuned(folder, device)
        return model, tok
    if not (folder / "config.json").exists():
        raise LmforgeError(f"{folder}: no config.json (not a model directory)")
    model = load_hf(folder, device) if is_hf_dir(folder) else load_pretrained(folder, device)
    tok = None
    if tokenizer and any((folder / name).exists() for name in TOKENIZER_FILES):
        from lmforge.tokenizers import load_tokenizer

        tok = load_tokenizer(folder)
    return model, tok


__all__ = ["__version__", "load"]
