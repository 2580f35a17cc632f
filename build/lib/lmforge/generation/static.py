"""Fixed-shape decoding: one compiled step, on CUDA one CUDA graph, for every new token.

Decoding one token of a 124M-parameter GPT-2 reads its 250 MB of weights once: on a GPU that takes
~0.1 ms, but the eager loop launches some 200 small kernels per token from Python, ~10 µs each. The
GPU waits for the host. A CUDA graph records the kernels of one step once and replays them with one
launch, and ``torch.compile(mode="reduce-overhead")`` builds one, provided every step has the same
shapes and reads its inputs at the same addresses. The eager loop has neither: the cache's filled
length slices the keys, a Python number that grows every step. Here instead

    KV cache      (B, H, P + N, d) buffers, each new position written at ``column``, a (1,) device tensor
    key mask      (B, P + N): a real (not padding) token, and written already: column index <= ``column``
    one step      tokens (B,) -> the model (one position) -> next tokens (B,), stop bookkeeping included

so step t and step t + 1 differ only in the values inside the same tensors. The prompt runs eagerly first
(its length varies from call to call), then ``column`` starts after it.

    steps = make_steps(model, ids, mask, n, caches=reusable_caches(model, ids, n))
    logits = steps.first()                       # the prompt: eager, last position's logits only
    step = FixedStep(steps)                      # fix the caches at column P
    tokens, finished, logits = compiled_step(device)(step, tokens, finished, noise, ...)   # per token

The sampling noise is drawn outside the compiled step from the caller's generator, in the same order as
the eager loop draws it, so both paths give the same tokens for the same seed.
"""

from __future__ import annotations

import functools
import weakref

import torch
from torch import nn

from lmforge.generation.sampling import next_token, repetition_penalty
from lmforge.generation.steps import DecoderSteps, Seq2SeqSteps
from lmforge.models.interfaces import is_encoder_decoder
from lmforge.nn.layers import LayerCache


class FixedStep:
    """Feed one token per row at ``column`` with the same shapes every time; the prompt has already run.

    Works for models whose caches are ``LayerCache`` lists (lmforge's Decoder and Seq2Seq) and whose
    ``forward`` / ``decode`` take ``attention_mask`` / ``tgt_mask`` covering the whole cache.
    """

    def __init__(self, steps: DecoderSteps | Seq2SeqSteps) -> None:
        self.steps, self.model, self.caches = steps, steps.model, steps.caches
        b, total = steps.ids.shape
        device = steps.ids.device
        self.column = torch.full((1,), steps.length, dtype=torch.long, device=device)  # where the next token goes
        self.columns = torch.arange(total, device=device)  # (P + N,)
        self.seq2seq = isinstance(steps, Seq2SeqSteps)
        padded = not self.seq2seq and steps.padded
        self.real = steps.mask.bool() if padded else torch.ones(b, total, dtype=torch.bool, device=device)
        self.positions = steps.positions if padded else None  # (B, P + N), left padding: real tokens count
        for cache in self.caches:
            cache.self_attention.fix(self.column)
        if device.type == "cuda":  # the CUDA graph reads the buffers in place instead of copying them in
            for cache in self.caches:
                for kv in (cache.self_attention, cache.cross_attention):
                    if kv is not None:
                        torch._dynamo.mark_static_address(kv.k)
                        torch._dynamo.mark_static_address(kv.v)

    def __call__(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (B,) written at ``column`` -> next-token logits (B, V). Does not advance ``column``."""
        visible = self.real & (self.columns <= self.column)  # (B, P + N) keys this token may attend to
        ids = tokens[:, None]  # (B, 1)
        if self.seq2seq:
            out = self.model.decode(ids, None, src_mask=self.steps.src_mask, tgt_mask=visible, caches=self.caches,
                                    position_ids=self.column)
        else:
            positions = self.column if self.positions is None else self.positions.index_select(1, self.column)
            out = self.model(ids, attention_mask=visible, position_ids=positions, caches=self.caches)
        return out.logits[:, -1]  # (B, V)

    def next(self, tokens: torch.Tensor, step_fn=None) -> torch.Tensor:
        """Like ``Steps.next``: feed tokens (B,), advance, return the next logits (B, V)."""
        logits = (step_fn or fixed_logits)(self, tokens).clone()  # a CUDA graph overwrites its outputs
        self.column += 1
        return logits


def fixed_logits(step: FixedStep, tokens: torch.Tensor) -> torch.Tensor:
    return step(tokens)


def decode_step(step: FixedStep, tokens: torch.Tensor, finished: torch.Tensor, noise: torch.Tensor | None,
                temperature: float, top_k: int | None, top_p: float | None, pad_id: int,
                stop: torch.Tensor | None, seen: torch.Tensor | None = None, penalty: float = 1.0
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One token of every row: (tokens (B,), finished (B,)) -> (next tokens, finished, their logits (B, V),
    seen (B, V) updated).

    A row that has stopped gets ``pad_id``; a row whose token is in ``stop`` is finished from now on. With
    ``seen`` (the tokens each row's text holds), the repetition penalty applies before the choice.
    """
    logits = step(tokens)
    scores = repetition_penalty(logits, seen, penalty) if seen is not None else logits
    chosen = next_token(scores, temperature, top_k, top_p, noise=noise)  # (B,)
    if stop is not None:
        chosen = chosen.masked_fill(finished, pad_id)
        finished = finished | torch.isin(chosen, stop)
    if seen is not None:
        seen = seen.scatter(1, chosen[:, None], True)
    return chosen, finished, logits, seen


@functools.cache
def compiled(fn, device_type: str):
    """``fn`` compiled once per process and device type: CUDA graphs on CUDA, fused kernels elsewhere."""
    mode = "reduce-overhead" if device_type == "cuda" else None
    return torch.compile(fn, mode=mode, dynamic=False)


def supports_fixed_shapes(steps: DecoderSteps | Seq2SeqSteps) -> bool:
    """Whether ``FixedStep`` can drive this stepper: KV caches of lmforge's Transformer layers."""
    caches = steps.caches
    return bool(caches) and all(isinstance(c, LayerCache) for c in caches)


_POOL: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def reusable_caches(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int) -> list | None:
    """The caches of the last generation of this shape, kept for the next one (None: make new ones).

    A CUDA graph replays at the addresses it recorded: new buffers for every ``generate`` call would
    mean a new recording every call. One shape per model is kept; a shape in use is never handed out twice.
    """
    if not hasattr(model, "new_caches"):
        return None
    b, p = input_ids.shape
    total = 1 + max_new_tokens if is_encoder_decoder(model) else p + max_new_tokens
    if max(total, p) > getattr(getattr(model, "config", None), "max_positions", total):
        return None  # too long: the stepper says so, naming the option
    weight = next(model.parameters(), None)
    key = (b, p, max_new_tokens, input_ids.device, weight.dtype if weight is not None else None)
    pool = _POOL.setdefault(model, {})
    entry = pool.get(key)
    if entry is None or entry["busy"]:
        if is_encoder_decoder(model):
            caches = model.new_caches(b, total, p, device=input_ids.device)
        else:
            caches = model.new_caches(b, total, device=input_ids.device)
        if entry is not None:  # in use by another generation on this model: a private copy
            return caches
        pool.clear()
        entry = pool[key] = {"caches": caches, "busy": False}
    entry["busy"] = True
    return entry["caches"]


def release_caches(model: nn.Module, caches: list | None) -> None:
    """Hand caches from ``reusable_caches`` back to the pool."""
    for entry in _POOL.get(model, {}).values():
        if entry["caches"] is caches:
            entry["busy"] = False
