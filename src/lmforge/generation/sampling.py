"""Choosing the next token from the logits of the last position: greedy, temperature, top-k, top-p.

    greedy:       x_t = argmax_v  z_v
    temperature:  p_v = softmax(z / T)_v           T -> 0 is greedy, T = 1 the model, T > 1 flatter
    top-k:        keep the k largest z_v, renormalise                       (Fan et al. 2018)
    top-p:        keep the smallest set of most likely tokens whose mass is >= p   (Holtzman et al. 2019)
    repetition:   z_v / θ if z_v > 0 else z_v · θ, for tokens v already in the text   (Keskar et al. 2019)
    OpenAI's:     z_v + b_v - c_v · α_frequency - [c_v > 0] · α_presence,   c_v: times v was generated, b: bias
    log-probs:    log p_v = z_v - log Σ_u exp z_u     of the model's own distribution (before the settings above)

Filters set removed logits to -inf, so the softmax that follows renormalises over what is left.
Every function works on a batch of rows, logits (B, V), with shapes that do not depend on the values
(a compiled decoding step needs that), and never leaves the device.

Drawing a token. With q_v ~ Exp(1) independent, argmax_v p_v / q_v = argmin_v q_v / p_v is token v with
probability p_v (the first of V exponential clocks with rates p_v to ring). ``torch.multinomial`` draws one
sample exactly this way, but first checks the probabilities on the host, which waits for the device;
drawing q ourselves gives the same token for the same generator state, without the wait.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties with the k-th are kept), the rest become -inf.

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    return filter_rows(logits, torch.full(logits.shape[:1], k), torch.ones(logits.shape[:1]))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability mass is >= p.

    A token is dropped when the tokens more likely than it already hold mass >= p; the most likely
    token is always kept. With probabilities [0.5, 0.3, 0.15, 0.05]:

    >>> z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> top_p_filter(z, 0.75).isfinite().tolist()       # 0.5 < 0.75 <= 0.5 + 0.3
    [[True, True, False, False]]
    """
    return filter_rows(logits, torch.zeros(logits.shape[:1], dtype=torch.long), torch.full(logits.shape[:1], p))


def filter_rows(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-k, then top-p of what is left, each row with its own k (0: off) and p (1: off); logits (R, V).

    One sort serves both: the k-th largest value bounds the first filter (ties kept, as Hugging Face does), and
    the cumulative mass of the survivors, renormalised, decides the second.
    """
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (R, V)
    vocab = logits.shape[-1]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab).to(logits.device)  # (R,)
    kth = sorted_logits.gather(-1, (k - 1)[:, None])  # (R, 1) the k-th largest value
    drop_k = sorted_logits < kth  # (R, V) in sorted order
    probs = sorted_logits.masked_fill(drop_k, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely survivors
    drop_sorted = drop_k | (mass_before >= top_p.to(logits.device)[:, None])  # position 0 is always kept
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float | torch.Tensor) -> torch.Tensor:
    """CTRL's penalty (as Hugging Face's ``repetition_penalty``): a token already in the text is made less
    likely, its logit divided by θ when positive and multiplied by θ when negative (θ > 1 penalises).

    logits (B, V), seen (B, V) bool: which tokens each row's text holds; penalty θ, or (B,) one per row.

    >>> repetition_penalty(torch.tensor([[2.0, -1.0, 3.0]]), torch.tensor([[True, True, False]]), 2.0).tolist()
    [[1.0, -2.0, 3.0]]
    """
    z = logits.float()
    theta = penalty[:, None] if isinstance(penalty, torch.Tensor) else penalty
    return torch.where(seen, torch.where(z > 0, z / theta, z * theta), z)


def choose(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
           noise: torch.Tensor | None, filtered: bool | None = None) -> torch.Tensor:
    """One token per row, each row by its own settings: logits (R, V) -> (R,).

    temperature (R,): 0 is greedy (argmax), else softmax(z / T) filtered by top_k (R,) (0: off) and top_p (R,)
    (1: off) and drawn with ``noise`` (R, V) of Exp(1) (None when no row samples). A row's token depends on
    its own logits, settings and noise only. ``filtered``: whether any row has top_k or top_p (None: look, which
    waits for the device; the engine knows it on the host).

    >>> z = torch.tensor([[0.1, 2.0, -1.0], [3.0, 0.0, 0.0]])
    >>> choose(z, torch.zeros(2), torch.zeros(2, dtype=torch.long), torch.ones(2), None).tolist()
    [1, 0]
    """
    greedy = logits.argmax(dim=-1)  # (R,)
    if noise is None:
        return greedy
    sampling = temperature > 0
    z = logits.float() / torch.where(sampling, temperature, 1.0)[:, None]
    if filtered if filtered is not None else bool(((top_k > 0) | (top_p < 1)).any()):
        z = filter_rows(z, top_k, top_p)
    sampled = (torch.softmax(z, dim=-1) / noise).argmax(dim=-1)  # = torch.multinomial(probs, 1)
    return torch.where(sampling.to(logits.device), sampled, greedy)


def draw(logits: torch.Tensor, settings: torch.Tensor, generators: Sequence[torch.Generator | None],
         sampling: Sequence[bool], seen: torch.Tensor | None = None, filtered: bool = True) -> torch.Tensor:
    """The next token of each row by its own settings: the one token-choosing step of every decoding loop.

    logits (R, V); settings (4, R): temperature, top_k (0: off), top_p (1: off), repetition penalty (1: off);
    ``generators[r]`` draws row r's noise when ``sampling[r]`` (None: torch's default generator); ``seen`` (R, V)
    the tokens already in each row's text, for the penalty (None: no row is penalised).
    """
    temperature, top_k, top_p, penalty = settings
    if seen is not None:
        logits = repetition_penalty(logits, seen, penalty)
    noise = None
    if any(sampling):
        noise = torch.ones(logits.shape, dtype=torch.float32, device=logits.device)  # (R, V)
        for row, (samples, generator) in enumerate(zip(sampling, generators, strict=True)):
            if samples:
                noise[row] = exponential_noise(logits.shape[-1:], logits.device, generator)
    return choose(logits, temperature, top_k.long(), top_p, noise, filtered)


def next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pick one token per row from logits (B, V) -> (B,), every row with the same settings (``choose``).

    noise: (B, V) float32 draws of Exp(1) (``exponential_noise``); default drawn here from ``generator``.

    >>> next_token(torch.tensor([[0.1, 2.0, -1.0]])).tolist()
    [1]
    """
    rows = logits.shape[0]
    if temperature > 0 and noise is None:
        noise = exponential_noise(logits.shape, logits.device, generator)
    settings = (torch.full((rows,), float(temperature)), torch.full((rows,), top_k or 0),
                torch.full((rows,), float(top_p or 1.0)))
    return choose(logits, *(t.to(logits.device) for t in settings), noise if temperature > 0 else None)


def exponential_noise(shape: torch.Size | tuple[int, ...], device: torch.device,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) float32 draws of Exp(1): the randomness of one sampling step (see the module docstring)."""
    return torch.empty(shape, dtype=torch.float32, device=device).exponential_(1.0, generator=generator)


def token_logprobs(logits: torch.Tensor, token: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """log p(token) under the model's distribution of one row of ``logits`` (V,), and the ``top`` most likely
    tokens with theirs, most likely first (ties: the lower id). In float64 from the row's own bits, so a row that
    has the same logits alone and in a batch has the same log-probabilities.

    >>> lp, tops = token_logprobs(torch.tensor([0.0, 0.0, 2.0]), 0, 1)
    >>> round(lp, 4), [(t, round(v, 4)) for t, v in tops]
    (-2.2395, [(2, -0.2395)])
    """
    logp = logits.detach().double().log_softmax(-1)  # (V,)
    best = logp.topk(top) if top else None
    return float(logp[token]), tuple(zip(best.indices.tolist(), best.values.tolist(), strict=True)) if best else ()
