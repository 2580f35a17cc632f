"""Text generation for decoder-only (GPT) and encoder-decoder (Vaswani) models.

An autoregressive model gives p(x_t | x_<t). Generation picks a token, appends it, and asks again:

    logits = model(prompt)[:, -1]            # (B, V) scores of the next token
    repeat max_new_tokens times:
        token  = choose(logits)              # greedy, temperature, top-k, top-p (generation/sampling.py)
        logits = model(token, cache)[:, -1]  # one new token per row: the KV cache holds the rest

or keeps K hypotheses per prompt (beam search, generation/beam.py). A row stops at a stop token (the
model's ``eos_id`` by default); rows that stopped are filled with ``pad_id``.

    >>> import torch
    >>> from lmforge.models import Decoder, get_preset
    >>> model = Decoder(get_preset("gpt-tiny")).eval()
    >>> out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5)      # greedy
    >>> out.tokens.shape
    torch.Size([1, 5])
    >>> out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5, temperature=0.8, top_p=0.9, seed=0)
    >>> out = generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5, beams=4, length_penalty=1.0)

Prompts of different lengths go in one batch padded on the left (``pad_prompts``): each row then gives
what the prompt gives alone. For streaming, ``stream`` yields each step's tokens (B,) as they are chosen.

Speed: the loop does the least work per step. The cache is preallocated (no ``torch.cat``), only the
last position's logits are looked at, no mask or positions are built when nothing is padded, the chosen
tokens go into a preallocated (B, N) tensor, and everything runs under ``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.beam import beam_search
from lmforge.generation.sampling import exponential_noise, next_token
from lmforge.generation.sampling import repetition_penalty as repetition_penalty_
from lmforge.generation.static import (
    FixedStep,
    compiled,
    decode_step,
    fixed_logits,
    release_caches,
    reusable_caches,
    supports_fixed_shapes,
)
from lmforge.generation.steps import make_steps
from lmforge.generation.text import StopStrings
from lmforge.models.interfaces import is_encoder_decoder

__all__ = ["GenerationOutput", "generate", "pad_prompts", "stream"]

CHECK_EVERY = 16  # generate reads "has every row stopped?" every 16 tokens, not after each (a read waits)


@dataclass
class GenerationOutput:
    """What ``generate`` returns.

    tokens: (B, N) new tokens only (not the prompt), ``pad_id`` after a row's stop token.
    lengths: (B,) number of new tokens of each row, stop token included.
    logits: (B, N, V) the raw next-token logits of every step (``output_logits=True``, not for beams).
    scores: (B,) beam search: total log-probability / length ** length_penalty of the chosen sequence.
    """

    tokens: torch.Tensor
    lengths: torch.Tensor
    logits: torch.Tensor | None = None
    scores: torch.Tensor | None = None

    def to_lists(self) -> list[list[int]]:
        """Each row's new tokens without the padding: [[5, 9, 2], [7, 2]]."""
        return [row[:n] for row, n in zip(self.tokens.tolist(), self.lengths.tolist(), strict=True)]


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0,
                device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists into ids (B, P) and attention mask (B, P), 1 = real token.

    >>> ids, mask = pad_prompts([[5, 6, 7], [8]], pad_id=0)
    >>> ids.tolist(), mask.tolist()
    ([[5, 6, 7], [0, 0, 8]], [[1, 1, 1], [0, 0, 1]])
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise LmforgeError("prompt: every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
        mask[row, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def check_options(input_ids: torch.Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                  top_p: float | None, beams: int, repetition_penalty: float = 1.0) -> None:
    """Reject settings that make no sense, naming the option (the CLI prints it as one line)."""
    if input_ids.dim() != 2 or input_ids.shape[1] == 0:
        raise LmforgeError(f"input_ids must have shape (batch, length >= 1), got {tuple(input_ids.shape)}")
    if max_new_tokens < 0:
        raise LmforgeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if temperature < 0:
        raise LmforgeError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise LmforgeError(f"top_k must be >= 1, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise LmforgeError(f"top_p must be in (0, 1], got {top_p}")
    if beams < 1:
        raise LmforgeError(f"beams must be >= 1, got {beams}")
    if not repetition_penalty > 0:
        raise LmforgeError(f"repetition_penalty must be > 0 (1 = off), got {repetition_penalty}")
    if beams > 1 and repetition_penalty != 1.0:
        raise LmforgeError("repetition_penalty: works with greedy decoding and sampling, not with beam search")
    if beams > 1 and (temperature > 0 or top_k is not None or top_p is not None):
        raise LmforgeError("beams: beam search is deterministic; use it with temperature 0 and no top_k/top_p")


def model_ids(model: nn.Module, stop_ids: Sequence[int] | None, pad_id: int | None) -> tuple[list[int], int]:
    """Stop tokens (default: the model's eos_id) and the padding id (default pad_id, else eos, else 0)."""
    config = getattr(model, "config", None)
    eos = getattr(config, "eos_id", None)
    stop = list(stop_ids) if stop_ids is not None else ([eos] if eos is not None else [])
    if pad_id is None:
        pad_id = getattr(config, "pad_id", None)
        pad_id = pad_id if pad_id is not None else (eos if eos is not None else 0)
    return stop, pad_id


def stream(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 50,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_ids: Sequence[int] | None = None,
    pad_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    start_id: int | None = None,
    logits_out: list[torch.Tensor] | None = None,
    compile: bool | None = None,
    check_every: int = 1,
    repetition_penalty: float = 1.0,
    stop_strings: Sequence[str] | StopStrings | None = None,
    tokenizer: Any = None,
) -> Iterator[torch.Tensor]:
    """Yield the next token of every row (B,) step by step: greedy or sampled, with a KV cache.

    Arguments as in ``generate``. A row that has stopped yields ``pad_id``; the iteration ends when every
    row has stopped or after ``max_new_tokens`` steps. ``logits_out``, when given, receives each step's
    raw logits (B, V). Whether every row has stopped is read every ``check_every`` steps (a read waits for
    the device); the steps in between yield ``pad_id`` for the rows that stopped. ``stop_strings`` (with the
    ``tokenizer``) end a row when its text holds one of them; ``repetition_penalty`` θ > 1 makes tokens
    already in the text less likely (``sampling.repetition_penalty``).

    >>> for tokens in stream(model, ids, max_new_tokens=3):    # doctest: +SKIP
    ...     print(tokenizer.decode(tokens.tolist()), end="", flush=True)
    """
    check_options(input_ids, max_new_tokens, temperature, top_k, top_p, 1, repetition_penalty)
    stop, pad_id = model_ids(model, stop_ids, pad_id)
    device = input_ids.device
    text_stops = text_stops_for(stop_strings, tokenizer, input_ids.shape[0])
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(seed)
    stop_tensor = torch.tensor(stop, dtype=torch.long, device=device) if stop else None
    fixed = wants_compile(compile, device) and use_cache
    # inference_mode is entered around each piece of work, not around the yield: a generator's context
    # would otherwise stay active in the caller's code between steps.
    with torch.inference_mode():
        caches = reusable_caches(model, input_ids, max_new_tokens) if fixed else None
    try:
        with torch.inference_mode():
            steps = make_steps(model, input_ids, attention_mask, max_new_tokens, use_cache, start_id, caches)
            logits = steps.first() if max_new_tokens else None  # (B, V) the prompt, eagerly
            scores_shape = logits.shape if logits is not None else None
            finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=device)  # (B,)
            tokens = finished.long()  # replaced by the first choice
            seen = None
            if repetition_penalty != 1.0 and logits is not None:  # (B, V): the tokens each row's text holds
                seen = seen_tokens(model, input_ids, attention_mask, logits.shape[-1])
            step = FixedStep(steps) if fixed and max_new_tokens > 1 and supports_fixed_shapes(steps) else None
            step_fn = compiled(decode_step, device.type) if step is not None else None
        for t in range(max_new_tokens):
            with torch.inference_mode():
                if t == 0 or step is None:  # eager: the model step, then the choice
                    logits = logits if t == 0 else steps.next(tokens)
                    scores = repetition_penalty_(logits, seen, repetition_penalty) if seen is not None else logits
                    tokens = next_token(scores, temperature, top_k, top_p, generator)  # (B,)
                    if stop_tensor is not None or text_stops is not None:
                        tokens = tokens.masked_fill(finished, pad_id)
                    if stop_tensor is not None:
                        finished = finished | torch.isin(tokens, stop_tensor)
                    if seen is not None:
                        seen = seen.scatter(1, tokens[:, None], True)
                else:  # one compiled call: model step, choice and stop bookkeeping
                    noise = exponential_noise(scores_shape, device, generator) if temperature > 0 else None
                    out = step_fn(step, tokens, finished, noise, temperature, top_k, top_p, pad_id, stop_tensor,
                                  seen, repetition_penalty)
                    tokens, finished = out[0].clone(), out[1].clone()  # a CUDA graph reuses its outputs
                    logits = out[2].clone() if logits_out is not None else None
                    seen = out[3].clone() if seen is not None else None
                    step.column += 1
                if text_stops is not None:  # decoded on the host: one wait per token, only when asked for
                    finished = finished | text_stops.update(tokens)
                if logits_out is not None:
                    logits_out.append(logits)
            yield tokens
            ends = stop or text_stops is not None
            if t + 1 == max_new_tokens or (ends and (t + 1) % check_every == 0 and bool(finished.all())):
                return
    finally:
        release_caches(model, caches)


def wants_compile(compile: bool | None, device: torch.device) -> bool:
    """``compile`` with None resolved: on for CUDA (where CUDA graphs pay), off elsewhere."""
    return device.type == "cuda" if compile is None else compile


def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_new_tokens: int = 50,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    beams: int = 1,
    length_penalty: float = 1.0,
    stop_ids: Sequence[int] | None = None,
    pad_id: int | None = None,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    use_cache: bool = True,
    start_id: int | None = None,
    output_logits: bool = False,
    compile: bool | None = None,
    repetition_penalty: float = 1.0,
    stop_strings: Sequence[str] | None = None,
    tokenizer: Any = None,
) -> GenerationOutput:
    """Continue each prompt (decoder-only) or translate each source (encoder-decoder) by up to N tokens.

    Args:
        model: a ``Decoder``, a ``Seq2Seq``, or anything with the same ``forward``/``decode`` and
            ``new_caches``.
        input_ids: (B, P) prompts (decoder) or sources (encoder-decoder), left-padded (``pad_prompts``).
        attention_mask: (B, P) 1 for real tokens, 0 for padding; None when nothing is padded.
        max_new_tokens: N, the most tokens to add to each row.
        temperature: 0 = greedy (argmax); otherwise sample from softmax(logits / temperature).
        top_k: sample only among the k most likely tokens.
        top_p: sample only among the smallest set of tokens whose probability mass is >= top_p.
        beams: K > 1 runs beam search (deterministic; no sampling options).
        length_penalty: beam search ranks finished sequences by log p / length ** length_penalty.
        stop_ids: tokens that end a row (kept in the output); default [model.config.eos_id].
        pad_id: fills rows after their stop token; default the model's pad_id, else eos_id, else 0.
        seed / generator: make sampling reproducible (same seed, same output).
        use_cache: False re-runs the whole prefix every step (the reference the cache is tested against).
        start_id: first decoder token of an encoder-decoder (default config.bos_id).
        output_logits: also return every step's raw logits (B, N, V).
        compile: decode each token with one fixed-shape step compiled by ``torch.compile`` (CUDA graphs on
            CUDA; generation/static.py); None = on when the device is CUDA. Same tokens as eager.
        repetition_penalty: θ > 1 makes tokens already in the text (prompt and new tokens) less likely
            (CTRL, Keskar et al. 2019); greedy and sampling.
        stop_strings: end a row once its new text holds one of these strings (kept, like stop tokens), with
            ``tokenizer`` to decode; ``generation.text.cut_at_stop`` trims the text after it.
    """
    check_options(input_ids, max_new_tokens, temperature, top_k, top_p, beams, repetition_penalty)
    stop, pad = model_ids(model, stop_ids, pad_id)
    if beams > 1 and stop_strings:
        raise LmforgeError("stop_strings: beam search ends on stop tokens only; use greedy or sampling")
    if beams > 1:
        seqs, scores = run_beams(model, input_ids, attention_mask, beams, max_new_tokens, stop, pad,
                                 length_penalty, use_cache, start_id, wants_compile(compile, input_ids.device))
        width = max((len(s) for s in seqs), default=0)
        tokens = torch.full((len(seqs), width), pad, dtype=torch.long)
        for row, seq in enumerate(seqs):
            tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        lengths = torch.tensor([len(s) for s in seqs])
        return GenerationOutput(tokens.to(input_ids.device), lengths.to(input_ids.device),
                                scores=torch.tensor(scores))

    b = input_ids.shape[0]
    out = torch.full((b, max_new_tokens), pad, dtype=torch.long, device=input_ids.device)  # (B, N)
    logits: list[torch.Tensor] | None = [] if output_logits else None
    n = 0
    text_stops = text_stops_for(stop_strings, tokenizer, b)
    for n, tokens in enumerate(stream(model, input_ids, attention_mask, max_new_tokens, temperature, top_k,
                                      top_p, stop, pad, seed, generator, use_cache, start_id, logits, compile,
                                      check_every=CHECK_EVERY, repetition_penalty=repetition_penalty,
                                      stop_strings=text_stops), 1):
        out[:, n - 1] = tokens
    if stop:  # the steps past the last row's stop token (read every CHECK_EVERY steps) are dropped
        lengths = first_stop(out[:, :n], stop) + 1
        stopped = torch.isin(out[:, :n], torch.tensor(stop, device=out.device)).any(1)
    else:
        lengths = torch.full((b,), n, device=input_ids.device)
        stopped = torch.zeros(b, dtype=torch.bool, device=input_ids.device)
    if text_stops is not None:  # a stop string can end a row before (or without) a stop token
        by_text = torch.tensor([e if e is not None else n for e in text_stops.ends], device=lengths.device)
        lengths = torch.minimum(lengths, by_text)
        stopped = stopped | torch.tensor([e is not None for e in text_stops.ends], device=stopped.device)
    if (stop or text_stops is not None) and n and bool(stopped.all()):
        n = int(lengths.max())
    stacked = torch.stack(logits[:n], dim=1) if logits else None  # (B, N, V)
    return GenerationOutput(out[:, :n], lengths, stacked)


def run_beams(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, beams: int,
              max_new_tokens: int, stop: list[int], pad: int, length_penalty: float, use_cache: bool,
              start_id: int | None, fixed: bool) -> tuple[list[list[int]], list[float]]:
    """Beam search; with ``fixed``, each step after the first is one compiled fixed-shape model call."""
    with torch.inference_mode():
        steps = make_steps(model, input_ids, attention_mask, max_new_tokens, use_cache, start_id)
        step_fn = None
        if fixed and use_cache and supports_fixed_shapes(steps):
            fixed_step: list[FixedStep] = []  # built once the beams are expanded, at the first step

            def step_fn(s, tokens):
                if not fixed_step:
                    fixed_step.append(FixedStep(s))
                return fixed_step[0].next(tokens, compiled(fixed_logits, input_ids.device.type))

        return beam_search(steps, input_ids.shape[0], beams, max_new_tokens, stop, pad, length_penalty, step_fn)


def text_stops_for(strings: Sequence[str] | StopStrings | None, tokenizer: Any, batch: int) -> StopStrings | None:
    """The stop-string tracker for ``strings`` (None when there are none)."""
    if strings is None or isinstance(strings, StopStrings):
        return strings
    if not strings:
        return None
    if tokenizer is None:
        raise LmforgeError("stop_strings: pass the tokenizer, to read the text the tokens make")
    return StopStrings(tokenizer, strings, batch)


def seen_tokens(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                vocab: int) -> torch.Tensor:
    """(B, V) bool: the prompt's tokens (a decoder's text starts with its prompt; an encoder-decoder's output
    does not hold its source), padding left out."""
    seen = torch.zeros(input_ids.shape[0], vocab, dtype=torch.bool, device=input_ids.device)
    if is_encoder_decoder(model):
        return seen
    real = torch.ones_like(input_ids) if attention_mask is None else attention_mask.long()
    hits = torch.zeros(input_ids.shape[0], vocab, dtype=torch.long, device=input_ids.device)
    return hits.scatter_reduce(1, input_ids, real, "amax").bool()


def first_stop(tokens: torch.Tensor, stop: Sequence[int]) -> torch.Tensor:
    """(B,) index of each row's first stop token, or N - 1 when there is none.

    >>> first_stop(torch.tensor([[4, 2, 0], [4, 5, 6]]), [2]).tolist()
    [1, 2]
    """
    hit = torch.isin(tokens, torch.tensor(list(stop), device=tokens.device))  # (B, N)
    n = tokens.shape[1]
    index = torch.where(hit, torch.arange(n, device=tokens.device), n - 1)
    return index.min(dim=1).values if n else torch.zeros(tokens.shape[0], dtype=torch.long)
