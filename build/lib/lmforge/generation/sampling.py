"""Choosing the next token from the logits of the last position: greedy, temperature, top-k, top-p.

    greedy:       x_t = argmax_v  z_v
    temperature:  p_v = softmax(z / T)_v           T -> 0 is greedy, T = 1 the model, T > 1 flatter
    top-k:        keep the k largest z_v, renormalise                       (Fan et al. 2018)
    top-p:        keep the smallest set of most likely tokens whose mass is >= p   (Holtzman et al. 2019)
    repetition:   z_v / θ if z_v > 0 else z_v · θ, for tokens v already in the text   (Keskar et al. 2019)

Filters set removed logits to -inf, so the softmax that follows renormalises over what is left.
Every function works on a batch of rows, logits (B, V), with shapes that do not depend on the values
(a compiled decoding step needs that), and never leaves the device.

Drawing a token. With q_v ~ Exp(1) independent, argmax_v p_v / q_v = argmin_v q_v / p_v is token v with
probability p_v (the first of V exponential clocks with rates p_v to ring). ``torch.multinomial`` draws one
sample exactly this way, but first checks the probabilities on the host, which waits for the device;
drawing q ourselves gives the same token for the same generator state, without the wait.
"""

from __future__ import annotations

import torch


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits of each row (ties with the k-th are kept), the rest become -inf.

    >>> top_k_filter(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), 2).tolist()
    [[-inf, 3.0, 2.0, -inf]]
    """
    if k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]  # (B, 1) the k-th largest
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability mass is >= p.

    A token is dropped when the tokens more likely than it already hold mass >= p; the most likely
    token is always kept. With probabilities [0.5, 0.3, 0.15, 0.05]:

    >>> z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    >>> top_p_filter(z, 0.75).isfinite().tolist()       # 0.5 < 0.75 <= 0.5 + 0.3
    [[True, True, False, False]]
    """
    if p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (B, V)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # mass of the strictly more likely tokens
    drop_sorted = mass_before >= p  # (B, V) in sorted order; position 0 always has mass_before = 0
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (as Hugging Face's ``repetition_penalty``): a token already in the text is made less
    likely, its logit divided by θ when positive and multiplied by θ when negative (θ > 1 penalises).

    logits (B, V), seen (B, V) bool: which tokens each row's text holds.

    >>> repetition_penalty(torch.tensor([[2.0, -1.0, 3.0]]), torch.tensor([[True, True, False]]), 2.0).tolist()
    [[1.0, -2.0, 3.0]]
    """
    z = logits.float()
    return torch.where(seen, torch.where(z > 0, z / penalty, z * penalty), z)


def next_token(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """Pick one token per row from logits (B, V) -> (B,). temperature 0 is greedy (argmax).

    noise: (B, V) float32 draws of Exp(1) (``exponential_noise``); default drawn here from ``generator``.

    >>> next_token(torch.tensor([[0.1, 2.0, -1.0]])).tolist()
    [1]
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    z = logits.float() / temperature
    if top_k is not None:
        z = top_k_filter(z, top_k)
    if top_p is not None:
        z = top_p_filter(z, top_p)
    probs = torch.softmax(z, dim=-1)  # (B, V)
    if noise is None:
        noise = exponential_noise(probs.shape, probs.device, generator)
    return (probs / noise).argmax(dim=-1)  # = torch.multinomial(probs, 1, generator).squeeze(-1)


def exponential_noise(shape: torch.Size | tuple[int, ...], device: torch.device,
                      generator: torch.Generator | None = None) -> torch.Tensor:
    """(B, V) float32 draws of Exp(1): the randomness of one sampling step (see the module docstring)."""
    return torch.empty(shape, dtype=torch.float32, device=device).exponential_(1.0, generator=generator)
