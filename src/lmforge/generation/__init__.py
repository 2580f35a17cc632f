"""Decoding: turn a model's next-token scores into text, for one prompt or for a server's stream of requests.

    lm.py          LM: model + tokenizer + chat format + engine; what generate, chat, evaluate, beams and serve use
    engine.py      the decoding engine: the scheduler, a runner and the outputs stage, stepped together
    scheduler.py   which requests hold which slots: admission, compaction, stop and length (no torch)
    runners/       the model's side of the engine, one runner per device family (eager, cpu, compiled)
    outputs.py     after a step: incremental text, stop strings, the requests' callbacks
    requests.py    a Request, the Generation it becomes, and the one context check
    slots.py       the fixed-shape KV cache of the engine's slots, and the buckets that bound its shapes
    lean.py        the decoding step of a decoder in few torch calls (one token a row; the CPU runner's)
    prefix.py      prompt beginnings seen before, kept in blocks and reused
    adapters.py    several LoRA adapters over one base: each row's own adapter in one batched call (serve --adapter)
    decoding.py    generate / stream / pad_prompts: the functions over any model (the engine or a plain stepper)
    options.py     the settings of decoding (max_new_tokens, temperature, top_k, ...), declared once (no torch)
    sampling.py    choosing a token: temperature, top-k, top-p, repetition penalty
    constraints.py a reply forced to match a JSON schema, a regex or a choice: grammar masks per row (llguidance)
    steps.py       feeding a model one step at a time with a KV cache (decoder-only or encoder-decoder)
    beam.py        beam search
    text.py        prompts as the model expects them; TextStream prints new text as tokens arrive
    captions.py    captions of image-feature grids (a GridCaptioner)

    >>> from lmforge.generation import generate, stream, pad_prompts   # doctest: +SKIP

Importing the package imports nothing heavy: each name loads its module on first use (the command line reads
``generation.options`` at start-up without torch).
"""

from importlib import import_module

_HOMES = {"GenerationOutput": "decoding", "generate": "decoding", "pad_prompts": "decoding", "stream": "decoding",
          "next_token": "sampling", "top_k_filter": "sampling", "top_p_filter": "sampling",
          "GenerateOptions": "options", "LM": "lm", "Engine": "engine", "Request": "requests",
          "Constraint": "constraints"}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
