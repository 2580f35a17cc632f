"""Decoding: turn a model's next-token scores into text.

    decoding.py   generate / stream / pad_prompts: the loop (greedy, sampling, beams) over any model
    sampling.py   choosing a token: temperature, top-k, top-p
    steps.py      feeding a model one step at a time with a KV cache (decoder-only or encoder-decoder)
    beam.py       beam search
    text.py       prompts as the model expects them; TextStream prints new text as tokens arrive
    captions.py   captions of image-feature grids (a GridCaptioner)

    >>> from lmforge.generation import generate, stream, pad_prompts   # doctest: +SKIP
"""

from lmforge.generation.decoding import GenerationOutput, generate, pad_prompts, stream
from lmforge.generation.sampling import next_token, top_k_filter, top_p_filter

__all__ = ["GenerationOutput", "generate", "next_token", "pad_prompts", "stream", "top_k_filter", "top_p_filter"]
