"""Beam search: keep the K most likely partial sequences instead of only the single best one.

Greedy decoding commits to the most likely token at every step and can miss a better sequence whose
first token looked worse. Beam search keeps K hypotheses ("beams") per prompt. At each step every
beam is extended by every token, each candidate is scored by its total log-probability

    score(y_1..y_t) = sum_i log p(y_i | x, y_<i)

and the K best candidates survive. A candidate that ends with a stop token is set aside as finished,
with its score divided by length ** length_penalty (Wu et al. 2016, simplified): 0 compares raw
log-probabilities (favouring short outputs, since every token adds a negative term), 1 compares the
average log-probability per token, > 1 favours longer outputs still.

A prompt is done when it holds K finished hypotheses and its best running beam, normalised at its
current length, cannot beat the worst of them (the heuristic of Hugging Face's ``early_stopping=False``).
At ``max_new_tokens`` the running beams join the finished ones and the best normalised score wins.

Everything stays on the device, as tensors over all prompts at once: per step, the 2K best candidates
of each prompt (B, 2K); the K best of them that do not stop become the beams; those among the top K that
stop join the finished hypotheses (B, K) by one stable sort. No Python loop runs over prompts or candidates.
"""

from __future__ import annotations

import torch

from lmforge.generation.steps import DecoderSteps, Seq2SeqSteps

CHECK_EVERY = 8  # steps between two reads of "is every prompt done?" (a read waits for the device)


class Finished:
    """The best K finished hypotheses of every prompt: normalised scores (B, K), tokens (B, K, N), lengths.

    ``add`` merges new candidates the way a list appended in order and stably sorted by score would:
    on a tie the hypothesis that was found first ranks first.
    """

    def __init__(self, batch: int, k: int, n: int, pad_id: int, device: torch.device) -> None:
        self.scores = torch.full((batch, k), float("-inf"), dtype=torch.float64, device=device)
        self.tokens = torch.full((batch, k, n), pad_id, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch, k, dtype=torch.long, device=device)
        self.count = torch.zeros(batch, dtype=torch.long, device=device)  # hypotheses held, up to K

    def add(self, scores: torch.Tensor, tokens: torch.Tensor, length: int, keep: torch.Tensor) -> None:
        """Candidates (B, K) normalised scores with tokens (B, K, N) of ``length``; ``keep`` (B, K) says which."""
        k = self.scores.shape[1]
        scores = scores.masked_fill(~keep, float("-inf"))
        order = torch.cat([self.scores, scores], 1).sort(dim=1, descending=True, stable=True).indices[:, :k]
        lengths = torch.cat([self.lengths, torch.full_like(self.lengths, length)], 1)
        pool = torch.cat([self.tokens, tokens], 1)  # (B, 2K, N)
        self.scores = torch.cat([self.scores, scores], 1).gather(1, order)
        self.lengths = lengths.gather(1, order)
        self.tokens = pool.gather(1, order[..., None].expand(-1, -1, pool.shape[-1]))
        self.count = (self.count + keep.sum(1)).clamp(max=k)


def beam_search(
    steps: DecoderSteps | Seq2SeqSteps,
    batch: int,
    beams: int,
    max_new_tokens: int,
    stop_ids: list[int],
    pad_id: int,
    length_penalty: float = 1.0,
) -> tuple[list[list[int]], list[float]]:
    """Best sequence (new tokens, stop token included) and its normalised score for each of ``batch`` prompts.

    ``steps`` holds the ``batch`` prompts; they are expanded to batch * beams rows here: row b*K + j is
    beam j of prompt b. ``steps`` may be a plain stepper (generation/steps.py) or the engine's slots
    (``steps.SlotSteps``: its compiled fixed-shape step).
    """
    k = beams
    if max_new_tokens == 0:
        return [[] for _ in range(batch)], [0.0] * batch
    logits = expanded(steps, batch, k)  # (B*K, V) next-token logits after each prompt, K times
    device, vocab = logits.device, logits.shape[-1]
    beam_scores = torch.zeros(batch, k, device=device)  # (B, K) total log-probability of each beam
    beam_scores[:, 1:] = float("-inf")  # all beams start equal: take the first step from beam 0 only
    tokens = torch.full((batch * k, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (B*K, N)
    finished = Finished(batch, k, max_new_tokens, pad_id, device)
    done = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    stop = torch.tensor(stop_ids, dtype=torch.long, device=device)
    first_row = (torch.arange(batch, device=device) * k)[:, None]  # (B, 1) row of beam 0 of each prompt
    own_rows = first_row + torch.arange(k, device=device)  # (B, K)

    for t in range(max_new_tokens):
        norm = float(t + 1) ** length_penalty  # every candidate of this step has t + 1 tokens
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        candidates = (beam_scores.view(-1, 1) + log_probs).view(batch, k * vocab)  # (B, K*V)
        # 2K candidates: even if K of them end in a stop token, K others remain to continue.
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2K) best first
        top_rows, top_token = first_row + top_index // vocab, top_index % vocab
        is_stop = torch.isin(top_token, stop)  # (B, 2K)
        # the beams: the K best candidates that do not stop (too few: the rest are dead, score -inf)
        pick = is_stop.to(torch.uint8).sort(dim=1, stable=True).indices[:, :k]  # (B, K) non-stops first
        alive = ~is_stop.gather(1, pick) & ~done[:, None]
        rows = torch.where(alive, top_rows.gather(1, pick), torch.where(done[:, None], own_rows, first_row))
        next_tokens = torch.where(alive, top_token.gather(1, pick), pad_id)
        next_scores = torch.where(alive, top_scores.gather(1, pick), float("-inf"))
        # finished: the candidates among the top K that stop (only those would have been beams)
        ends = is_stop[:, :k] & ~done[:, None]  # (B, K)
        history = tokens.index_select(0, top_rows[:, :k].flatten()).view(batch, k, -1)  # (B, K, N)
        history[:, :, t] = top_token[:, :k]
        finished.add(top_scores[:, :k].double() / norm, history, t + 1, ends)
        best_running = next_scores[:, 0].double() / norm
        done |= (finished.count >= k) & (best_running <= finished.scores[:, -1])
        index = rows.flatten()  # (B*K,)
        tokens = tokens.index_select(0, index)
        tokens[:, t] = next_tokens.flatten()
        beam_scores = next_scores
        if t + 1 == max_new_tokens or ((t + 1) % CHECK_EVERY == 0 and bool(done.all())):
            break
        steps.reorder(index)
        logits = steps.next(tokens[:, t])

    return best_of(finished, tokens.view(batch, k, -1), beam_scores, done, t + 1, pad_id, length_penalty)


def expanded(steps: DecoderSteps | Seq2SeqSteps, batch: int, k: int) -> torch.Tensor:
    """The prompts' first logits (B*K, V), each prompt's rows (caches, masks, memory) repeated K times: row
    b*K + j is beam j of prompt b."""
    logits = steps.first()  # (B, V)
    expand = torch.arange(batch, device=logits.device).repeat_interleave(k)  # (B*K,) [0, 0, 1, 1, ...]
    steps.reorder(expand)
    return logits.index_select(0, expand)


def best_of(finished: Finished, running: torch.Tensor, scores: torch.Tensor, done: torch.Tensor, length: int,
            pad_id: int, length_penalty: float) -> tuple[list[list[int]], list[float]]:
    """Out of steps: the running beams (B, K, N) of the prompts not done compete with the finished hypotheses;
    each prompt's best sequence (cut at its length) and normalised score."""
    running = running.clone()
    running[:, :, length:] = pad_id
    finished.add(scores.double() / float(length) ** length_penalty, running, length,
                 (~done)[:, None].expand(-1, running.shape[1]))
    lengths, best_scores = finished.lengths[:, 0].tolist(), finished.scores[:, 0].tolist()
    best = finished.tokens[:, 0].tolist()
    return [row[:n] for row, n in zip(best, lengths, strict=True)], best_scores
