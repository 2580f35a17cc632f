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

Two loops, one way to choose a token (``sampling.draw``): lmforge's Transformer decoders and encoder-decoders
run on the decoding engine (generation/engine.py: fixed-shape slots, compiled once per bucket), each row a
request with its own generator (``seed + row``); other models (RNNs, toys, ``use_cache=False``, the
reference the cache is tested against) run on a plain stepper (generation/steps.py) with the same draws.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.beam import beam_search
from lmforge.generation.lm import LM
from lmforge.generation.options import check_decoding
from lmforge.generation.outputs import TextOutput
from lmforge.generation.requests import Generation, Request
from lmforge.generation.sampling import draw
from lmforge.generation.steps import SlotSteps, make_steps
from lmforge.models.decoder import Decoder
from lmforge.models.interfaces import is_encoder_decoder, special_ids
from lmforge.models.seq2seq import Seq2Seq

__all__ = ["GenerationOutput", "generate", "pad_prompts", "stream"]


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


def prompt_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> list[list[int]]:
    """Each row's real tokens, the padding left out: [[5, 6, 7], [8]] from ``pad_prompts``' output."""
    ids = input_ids.tolist()
    if attention_mask is None:
        return ids
    return [[t for t, m in zip(row, keep, strict=True) if m] for row, keep in zip(ids, attention_mask.tolist(),
                                                                                   strict=True)]


def lm_for(model: nn.Module, compile: bool | None, tokenizer: Any = None, start_id: int | None = None) -> LM | None:
    """An ``LM`` over ``model`` for one call (its engine sized to the call), or None for the models the engine does
    not drive (RNNs, captioners, toys): they decode on a plain stepper."""
    if type(model) not in (Decoder, Seq2Seq):
        return None
    return LM(model, tokenizer, compile=compile, start_id=start_id)


# -- the two loops -------------------------------------------------------------------------------------------------
@dataclass
class Decoding:
    """The keyword arguments of ``stream`` and ``generate``, declared once (each explained in ``generate``)."""

    max_new_tokens: int = 50
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float = 1.0
    stop_ids: Sequence[int] | None = None
    pad_id: int | None = None
    seed: int | None = None
    generator: torch.Generator | None = None
    use_cache: bool = True
    start_id: int | None = None
    compile: bool | None = None
    stop_strings: Sequence[str] | None = None
    tokenizer: Any = None

    def resolve(self, model: nn.Module, input_ids: torch.Tensor, beams: int, keep_logits: bool) -> Options:
        """Checked against the settings' declarations (``options.check_decoding``: errors name the option), with
        the model's stop and pad ids filled in (``special_ids``)."""
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise LmforgeError(f"input_ids must have shape (batch, length >= 1), got {tuple(input_ids.shape)}")
        check_decoding(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                       top_p=self.top_p, repetition_penalty=self.repetition_penalty, beams=beams, seed=self.seed,
                       stop_strings=self.stop_strings)
        if self.stop_strings and self.tokenizer is None:
            raise LmforgeError("stop_strings: pass the tokenizer, to read the text the tokens make")
        ids = special_ids(model, self.tokenizer, stops=self.stop_ids, pad=self.pad_id)
        return Options(self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.repetition_penalty,
                       list(ids.stops), ids.pad, self.stop_strings or (), keep_logits)


@dataclass
class Options:
    """The resolved settings of one ``stream`` / ``generate`` call, every row alike."""

    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    repetition_penalty: float
    stop: list[int]
    pad: int
    stop_strings: Sequence[str]
    keep_logits: bool

    def request(self, ids: list[int], seed: int | None, generator: torch.Generator | None) -> Request:
        return Request(ids, max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                       top_p=self.top_p, repetition_penalty=self.repetition_penalty, seed=seed, generator=generator,
                       stop_ids=self.stop, stop_strings=self.stop_strings, keep_logits=self.keep_logits)


def engine_steps(lm: LM, prompts: list[list[int]], o: Options, seeds: list[int | None],
                 generator: torch.Generator | None, record: list[Generation]) -> Iterator[list[int]]:
    """Each position's tokens (B,) of the prompts run as requests of ``lm`` (pad for the rows that ended)."""
    t = 0
    for handles in lm.steps([o.request(p, s, generator) for p, s in zip(prompts, seeds, strict=True)]):
        if not record:
            record.extend(handles)
        while any(len(g.tokens) > t for g in handles) and all(g.done or len(g.tokens) > t for g in handles):
            yield [g.tokens[t] if len(g.tokens) > t else o.pad for g in handles]
            t += 1


def stepper_steps(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, o: Options,
                  seeds: list[int | None], generator: torch.Generator | None, use_cache: bool, start_id: int | None,
                  tokenizer: Any, record: list[Generation]) -> Iterator[list[int]]:
    """The same draws on a plain stepper (generation/steps.py): RNNs, toys, ``use_cache=False``."""
    b, device = input_ids.shape[0], input_ids.device
    record.extend(Generation(o.request([], s, generator)) for s in seeds)
    generators = [generator or (torch.Generator(device).manual_seed(s) if s is not None else None) for s in seeds]
    settings = torch.tensor([[o.temperature, o.top_k or 0, o.top_p or 1.0, o.repetition_penalty]] * b,
                            device=device).T  # (4, B)
    texts = [TextOutput(tokenizer, o.stop_strings) for _ in range(b)] if o.stop_strings else None
    seen, tokens = None, [0] * b
    with torch.inference_mode():
        steps = make_steps(model, input_ids, attention_mask, o.max_new_tokens, use_cache, start_id)
        logits = steps.first() if o.max_new_tokens else None  # (B, V)
        if o.repetition_penalty != 1.0 and logits is not None:
            seen = seen_tokens(model, input_ids, attention_mask, logits.shape[-1])
    for t in range(o.max_new_tokens):
        with torch.inference_mode():
            if t:
                logits = steps.next(torch.tensor(tokens, device=device))
            live = [not g.done for g in record]
            chosen = draw(logits, settings, generators, [o.temperature > 0 and x for x in live], seen).tolist()
            tokens = [c if x else o.pad for c, x in zip(chosen, live, strict=True)]
            if seen is not None:
                seen = seen.scatter(1, torch.tensor(tokens, device=device)[:, None], True)
        for row, (g, token, alive) in enumerate(zip(record, tokens, live, strict=True)):
            if alive:
                g.tokens.append(token)
                if o.keep_logits:
                    g.logits.append(logits[row])
                if texts is not None:
                    texts[row].add(token)
                if token in o.stop or (texts is not None and texts[row].stopped):
                    g.finish_reason = "stop"
                elif len(g.tokens) == o.max_new_tokens:
                    g.finish_reason = "length"
        yield tokens
        if all(g.done for g in record):
            return


def decode_rows(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, o: Options,
                d: Decoding, record: list[Generation]) -> Iterator[list[int]]:
    """The steps of every row on the engine (lmforge Transformers) or the plain stepper (the rest)."""
    prompts = prompt_rows(input_ids, attention_mask)
    seeds = [None if d.seed is None else d.seed + row for row in range(len(prompts))]  # each row its own stream
    lm = lm_for(model, d.compile, d.tokenizer, d.start_id) if d.use_cache and o.max_new_tokens else None
    if lm is not None:
        return engine_steps(lm, prompts, o, seeds, d.generator, record)
    return stepper_steps(model, input_ids, attention_mask, o, seeds, d.generator, d.use_cache, d.start_id,
                         d.tokenizer, record)


def stream(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
           **options: Any) -> Iterator[torch.Tensor]:
    """Yield the next token of every row (B,) step by step: greedy or sampled, with a KV cache.

    Keyword arguments: the fields of ``Decoding`` (as in ``generate``). A row that has stopped yields
    ``pad_id``; the iteration ends when every row has stopped or after ``max_new_tokens`` steps.

    >>> for tokens in stream(model, ids, max_new_tokens=3):    # doctest: +SKIP
    ...     print(tokenizer.decode(tokens.tolist()), end="", flush=True)
    """
    d = Decoding(**options)
    o = d.resolve(model, input_ids, beams=1, keep_logits=False)
    for tokens in decode_rows(model, input_ids, attention_mask, o, d, []):
        yield torch.tensor(tokens, device=input_ids.device)


def generate(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, beams: int = 1,
             length_penalty: float = 1.0, output_logits: bool = False, **options: Any) -> GenerationOutput:
    """Continue each prompt (decoder-only) or translate each source (encoder-decoder) by up to N tokens.

    Args:
        model: a ``Decoder``, a ``Seq2Seq``, or anything with the same ``forward``/``decode`` and
            ``new_caches``.
        input_ids: (B, P) prompts (decoder) or sources (encoder-decoder), left-padded (``pad_prompts``).
        attention_mask: (B, P) 1 for real tokens, 0 for padding; None when nothing is padded.
        beams: K > 1 runs beam search (deterministic; no sampling options).
        length_penalty: beam search ranks finished sequences by log p / length ** length_penalty.
        output_logits: also return every step's raw logits (B, N, V).

    The other keywords are the fields of ``Decoding``, shared with ``stream`` (defaults there):
        max_new_tokens: N, the most tokens to add to each row.
        temperature: 0 = greedy (argmax); otherwise sample from softmax(logits / temperature).
        top_k: sample only among the k most likely tokens.
        top_p: sample only among the smallest set of tokens whose probability mass is >= top_p.
        stop_ids: tokens that end a row (kept in the output); default [model.config.eos_id].
        pad_id: fills rows after their stop token; default the model's pad_id, else eos_id, else 0.
        seed: row b samples from its own generator seeded ``seed + b`` (the same row gives the same sample
            whatever else is in the batch); ``generator``: all rows draw from this one stream instead.
        use_cache: False re-runs the whole prefix every step (the reference the cache is tested against).
        start_id: first decoder token of an encoder-decoder (default config.bos_id).
        compile: the engine's prefill and step compiled by ``torch.compile`` once per bucket (CUDA graphs on
            CUDA; generation/engine.py); None = on when the device is CUDA. Same tokens as eager.
        repetition_penalty: θ > 1 makes tokens already in the text (prompt and new tokens) less likely
            (CTRL, Keskar et al. 2019); greedy and sampling.
        stop_strings: end a row once its new text holds one of these strings (kept, like stop tokens), with
            ``tokenizer`` to decode; ``generation.text.cut_at_stop`` trims the text after it.
    """
    d = Decoding(**options)
    o = d.resolve(model, input_ids, beams, output_logits)
    if beams > 1:
        seqs, scores = run_beams(model, input_ids, attention_mask, beams, d.max_new_tokens, o.stop, o.pad,
                                 length_penalty, d.use_cache, d.start_id, d.compile)
        return outputs(seqs, o.pad, input_ids.device, scores=torch.tensor(scores))
    record: list[Generation] = []
    for _ in decode_rows(model, input_ids, attention_mask, o, d, record):
        pass
    logits = None
    if output_logits:
        width = max(len(g.logits) for g in record)
        vocab = next(x for g in record for x in g.logits).shape[-1] if width else 0
        logits = torch.zeros(len(record), width, vocab, device=input_ids.device)  # (B, N, V)
        for row, g in enumerate(record):
            if g.logits:
                logits[row, : len(g.logits)] = torch.stack(g.logits)
    return outputs([g.tokens for g in record], o.pad, input_ids.device, logits=logits)


def outputs(seqs: list[list[int]], pad: int, device: torch.device, **extra: Any) -> GenerationOutput:
    """Token lists -> a padded (B, N) tensor and the lengths."""
    width = max((len(s) for s in seqs), default=0)
    tokens = torch.full((len(seqs), width), pad, dtype=torch.long)
    for row, seq in enumerate(seqs):
        tokens[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    lengths = torch.tensor([len(s) for s in seqs])
    return GenerationOutput(tokens.to(device), lengths.to(device), **extra)


def run_beams(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, beams: int,
              max_new_tokens: int, stop: list[int], pad: int, length_penalty: float, use_cache: bool,
              start_id: int | None, compile: bool | None) -> tuple[list[list[int]], list[float]]:
    """Beam search; lmforge's Transformers search on an engine's runner (its slots and compiled step), others on a
    plain stepper."""
    b = input_ids.shape[0]
    prompts = prompt_rows(input_ids, attention_mask)
    lm = lm_for(model, compile, start_id=start_id) if use_cache and max_new_tokens else None
    with torch.inference_mode():
        if lm is None:
            steps = make_steps(model, input_ids, attention_mask, max_new_tokens, use_cache, start_id)
            return beam_search(steps, b, beams, max_new_tokens, stop, pad, length_penalty)
        seq2seq = is_encoder_decoder(model)
        longest = (1 if seq2seq else max(map(len, prompts))) + max_new_tokens
        engine = lm.engine_for(b * beams, longest, max(map(len, prompts)) if seq2seq else 0)
        return beam_search(SlotSteps(engine.runner, prompts), b, beams, max_new_tokens, stop, pad, length_penalty)


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
