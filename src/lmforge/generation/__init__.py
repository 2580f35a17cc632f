"""Decoding: turn a model's next-token scores into text.

    decoding.py   generate / stream / pad_prompts: the loop (greedy, sampling, beams) over any model
    options.py    the settings of decoding (max_new_tokens, temperature, top_k, ...), declared once (no torch)
    sampling.py   choosing a token: temperature, top-k, top-p
    steps.py      feeding a model one step at a time with a KV cache (decoder-only or encoder-decoder)
    beam.py       beam search
    text.py       prompts as the model expects them; TextStream prints new text as tokens arrive
    captions.py   captions of image-feature grids (a GridCaptioner)

    >>> from lmforge.generation import generate, stream, pad_prompts   # doctest: +SKIP

Importing the package imports nothing heavy: each name loads its module on first use (the command line reads
``generation.options`` at start-up without torch).
"""

from importlib import import_module

_HOMES = {"GenerationOutput": "decoding", "generate": "decoding", "pad_prompts": "decoding", "stream": "decoding",
          "next_token": "sampling", "top_k_filter": "sampling", "top_p_filter": "sampling",
          "GenerateOptions": "options"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
