"""The same Llama-family model in lmforge and in transformers, for the decoding, serving and fine-tuning benchmarks.

``pair(path)`` loads SmolLM2-135M-Instruct (a GGUF file or an lmforge / Hugging Face directory) into lmforge and
copies its weights into a ``transformers`` ``LlamaForCausalLM``; ``pair(None)`` builds SmolLM2-135M's shape with
random weights (seeded), which costs the same to run: speed depends on the shapes, not on the values.
``converted(prefix)`` converts SmolLM2-135M-Instruct's GGUF file into an lmforge and a Hugging Face folder, for the
benchmarks that start each framework on its own folder (``bench/serve.py``, ``bench/sft.py``).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
from lmforge.models import Decoder
from lmforge.models.config import DecoderConfig

SMOLLM2_135M = dict(vocab_size=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, d_ff=1536,
                    max_positions=8192, activation="swiglu", norm="rmsnorm", positions="rotary", bias=False,
                    rope_base=100000.0, eps=1e-5, dropout=0.0, attention_dropout=0.0, bos_id=1, eos_id=2)


def lmforge_model(path: str | None, seed: int = 0) -> tuple[Decoder, str]:
    """(model, what it is): the checkpoint at ``path``, or SmolLM2-135M's shape with random weights."""
    if path:
        import lmforge

        model, _ = lmforge.load(path)
        return model.eval(), str(path)
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(**SMOLLM2_135M)).eval(), "SmolLM2-135M shape, random weights"


def hf_twin(model: Decoder):
    """A transformers LlamaForCausalLM holding the same weights (the logits agree to fp32 rounding)."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    transformers.logging.set_verbosity_error()
    config = LlamaConfig(**{k: v for k, v in llama_config_from_decoder(model.config).items()
                            if k not in ("architectures", "model_type", "torch_dtype", "dtype")})
    hf = LlamaForCausalLM(config).eval()
    state = {k: v[: model.config.vocab_size] if k.endswith(("embed_tokens.weight", "lm_head.weight")) else v
             for k, v in llama_state_from_decoder(model.state_dict(), model.config).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    assert not unexpected and all("lm_head" in k or "rotary" in k for k in missing), (missing, unexpected)
    if model.config.tie_embeddings:
        hf.tie_weights()
    return hf


@contextlib.contextmanager
def converted(prefix: str, keep: bool = False, env: dict | None = None) -> Iterator[Path]:
    """A new work folder holding SmolLM2-135M-Instruct converted by lmforge's CLI from its GGUF file to ``lmforge/``
    and then to ``hf/`` (``convert --to-hf``); removed at the end, whatever happens, unless ``keep`` (two copies of
    the model, 1.1 GB). ``env``: the converting commands' environment (default this process's)."""
    from lmforge.data.sources import smollm2_path

    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        cli = [sys.executable, "-m", "lmforge.cli"]
        subprocess.run([*cli, "convert", "--from-gguf", str(smollm2_path()), "--out", str(work / "lmforge"),
                        "--quiet"], check=True, env=env)
        subprocess.run([*cli, "convert", "--to-hf", str(work / "lmforge"), "--out", str(work / "hf"), "--quiet"],
                       check=True, env=env)
        yield work
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
