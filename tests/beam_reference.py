"""The beam search lmforge shipped before it went vectorised (issue 17): the oracle of tests/test_generate_fast.py.

Hypotheses live in Python lists and every step loops over prompts and candidates on the host: slow, but
plainly the algorithm. Kept verbatim apart from the names.

Beam search: keep the K most likely partial sequences instead of only the single best one.

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
"""

from __future__ import annotations

import torch

from lmforge.generation.steps import DecoderSteps, Seq2SeqSteps


class Hypotheses:
    """The best K finished sequences of one prompt, as (normalised score, tokens) pairs."""

    def __init__(self, k: int, length_penalty: float) -> None:
        self.k, self.length_penalty = k, length_penalty
        self.items: list[tuple[float, list[int]]] = []

    def normalise(self, log_prob: float, length: int) -> float:
        return log_prob / length**self.length_penalty

    def add(self, log_prob: float, tokens: list[int]) -> None:
        self.items.append((self.normalise(log_prob, len(tokens)), tokens))
        self.items.sort(key=lambda item: -item[0])
        del self.items[self.k :]

    def done(self, best_running_log_prob: float, length: int) -> bool:
        if len(self.items) < self.k:
            return False
        return self.normalise(best_running_log_prob, length) <= self.items[-1][0]


def reference_beam_search(
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
    beam j of prompt b.
    """
    k = beams
    if max_new_tokens == 0:
        return [[] for _ in range(batch)], [0.0] * batch
    logits = steps.first()  # (B, V) next-token logits after each prompt
    device = logits.device
    expand = torch.arange(batch, device=device).repeat_interleave(k)  # (B*K,) [0, 0, 1, 1, ...]
    steps.reorder(expand)  # caches, masks and memory repeated K times
    logits = logits.index_select(0, expand)  # (B*K, V)
    vocab = logits.shape[-1]
    beam_scores = torch.zeros(batch, k, device=device)  # (B, K) total log-probability of each beam
    beam_scores[:, 1:] = float("-inf")  # all beams start equal: take the first step from beam 0 only
    tokens = torch.full((batch * k, max_new_tokens), pad_id, dtype=torch.long, device=device)  # (B*K, N)
    finished = [Hypotheses(k, length_penalty) for _ in range(batch)]
    done = [False] * batch
    stop = set(stop_ids)

    for t in range(max_new_tokens):
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B*K, V)
        candidates = (beam_scores.view(-1, 1) + log_probs).view(batch, k * vocab)  # (B, K*V)
        # 2K candidates: even if K of them end in a stop token, K others remain to continue.
        top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=-1)  # (B, 2K)
        top_beam, top_token = top_index // vocab, top_index % vocab
        rows, next_tokens, next_scores = [], [], []
        history = tokens[:, :t].tolist()
        for b, (scores_b, beams_b, tokens_b) in enumerate(
            zip(top_scores.tolist(), top_beam.tolist(), top_token.tolist(), strict=True)
        ):
            chosen: list[tuple[int, int, float]] = []
            if done[b]:  # keep feeding padding; nothing here matters any more
                chosen = [(b * k + j, pad_id, float("-inf")) for j in range(k)]
            for rank, (score, beam, token) in enumerate(zip(scores_b, beams_b, tokens_b, strict=True)):
                if len(chosen) == k:
                    break
                if token in stop:
                    if rank < k:  # only a candidate that would have been in the top K counts
                        finished[b].add(score, [*history[b * k + beam], token])
                else:
                    chosen.append((b * k + beam, token, score))
            chosen += [(b * k, pad_id, float("-inf"))] * (k - len(chosen))  # only if > K stop candidates
            done[b] = done[b] or finished[b].done(chosen[0][2], t + 1)
            rows += [row for row, _, _ in chosen]
            next_tokens += [token for _, token, _ in chosen]
            next_scores += [score for _, _, score in chosen]
        index = torch.tensor(rows, device=device)
        tokens = tokens.index_select(0, index)
        tokens[:, t] = torch.tensor(next_tokens, device=device)
        beam_scores = torch.tensor(next_scores, device=device).view(batch, k)
        if all(done) or t + 1 == max_new_tokens:
            break
        steps.reorder(index)
        logits = steps.next(tokens[:, t])

    running = tokens[:, : t + 1].tolist()
    for b in range(batch):
        if not done[b]:  # out of steps: running beams compete with the finished ones
            for j in range(k):
                finished[b].add(beam_scores[b, j].item(), running[b * k + j])
    best = [hyps.items[0] if hyps.items else (0.0, []) for hyps in finished]
    return [seq for _, seq in best], [score for score, _ in best]
