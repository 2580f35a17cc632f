"""What a chat model can do: ``lmforge evaluate --model M --tasks FILE.jsonl [...]``, one JSON line per file.

Each line of a tasks file is the conversation so far (``messages``, ending with a user turn) and one of:

- ``"choices": [...]`` and ``"answer"``: multiple choice. Each choice is scored as the assistant's reply by its
  log-likelihood given the prompt: summed over its tokens (``none``), per token, or per character (``chars``,
  the default: a long choice is not penalised for being long). Accuracy under the chosen normalisation is the
  headline; all three are reported.
- ``"answer"`` (a string, or a list of acceptable strings): exact match of the greedy reply after ``normalize``.
- ``"reference"``: chrF (headline) and BLEU of the greedy replies against the references (sacrebleu).

Every score carries a 95% bootstrap interval (1,000 resamples of the items, seeded). ``--shots K --fewshot
FILE`` prepends K solved conversations from a separate split (the same K for every item, chosen by the seed).

    >>> normalize("  The Capital is PARIS. ")
    'the capital is paris'
    >>> normalize('"Uncertain".')
    'uncertain'
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8
from lmforge.generation.requests import check_room
from lmforge.tokenizers.chat import Message, messages_line
from lmforge.workflows.chat import ChatFormat

KINDS = ("choices", "answer", "reference")
RESAMPLES = 1000


def normalize(text: str) -> str:
    """Lower case, single spaces, no surrounding quotes and no final punctuation."""
    text = " ".join(text.lower().split())
    return text.strip(" \"'“”‘’`").rstrip(".!?;:").strip(" \"'“”‘’`")


def item_kind(item: dict[str, Any], where: str) -> str:
    if "choices" in item:
        choices = item["choices"]
        if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise LmforgeError(f"{where}: choices: expected a list of at least two non-empty strings")
        if item.get("answer") not in choices:
            raise LmforgeError(f"{where}: answer: {item.get('answer')!r} is not one of the choices")
        return "choices"
    if "answer" in item:
        answers = item["answer"] if isinstance(item["answer"], list) else [item["answer"]]
        if not answers or not all(isinstance(a, str) and a.strip() for a in answers):
            raise LmforgeError(f"{where}: answer: expected a non-empty string or a list of them")
        return "answer"
    if isinstance(item.get("reference"), str):
        return "reference"
    raise LmforgeError(f"{where}: expected \"choices\" + \"answer\", \"answer\" or \"reference\" beside messages")


def read_items(path: str | Path, limit: int = 0) -> tuple[str, list[dict[str, Any]]]:
    """A tasks file's kind and items (the first ``limit``); one line naming the file and line when wrong."""
    items, kinds = [], set()
    for number, line in enumerate(read_text_utf8(path, "tasks file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        item = messages_line(line, where)
        if item["messages"][-1]["role"] != "user":
            raise LmforgeError(f"{where}: messages: the last message must be the user's (the question)")
        kinds.add(item_kind(item, where))
        items.append(item)
        if limit and len(items) == limit:
            break
    if not items:
        raise LmforgeError(f"--tasks: {path} holds no items")
    if len(kinds) > 1:
        raise LmforgeError(f"--tasks: {path} mixes kinds ({', '.join(sorted(kinds))}); one kind per file")
    return kinds.pop(), items


def fewshot_turns(path: str | Path, shots: int, seed: int) -> list[Message]:
    """``shots`` solved conversations from ``path`` (a train split: each ends with the assistant), flattened."""
    from lmforge.data.chat import read_conversations

    conversations = [c for c in read_conversations(path) if c[-1]["role"] == "assistant"]
    if len(conversations) < shots:
        raise LmforgeError(f"--fewshot: {path} has {len(conversations)} conversations, --shots asks for {shots}")
    chosen = random.Random(seed).sample(conversations, shots)
    return [m for c in chosen for m in c if m["role"] != "system"]


def with_shots(messages: list[Message], shots: list[Message]) -> list[Message]:
    """The item's system message first, then the solved examples, then the item's own turns."""
    head = messages[:1] if messages[0]["role"] == "system" else []
    return head + shots + messages[len(head):]


# -- scoring ------------------------------------------------------------------------------------------------------
@torch.no_grad()
def choice_logprobs(model: torch.nn.Module, fmt: ChatFormat, prompts: list[list[int]], choices: list[list[str]],
                    batch_size: int) -> list[list[tuple[float, int]]]:
    """For each prompt and each of its choices: (summed log-probability of the choice's tokens, token count)."""
    device = next(model.parameters()).device
    rows = [(i, j, p, fmt.encode(c)) for i, (p, cs) in enumerate(zip(prompts, choices, strict=True))
            for j, c in enumerate(cs)]
    out: list[list[tuple[float, int]]] = [[(0.0, 0)] * len(cs) for cs in choices]
    rows.sort(key=lambda r: len(r[2]) + len(r[3]))  # similar lengths share a batch
    for start in range(0, len(rows), batch_size):
        batch = rows[start: start + batch_size]
        width = max(len(p) + len(c) for _, _, p, c in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        for r, (_, _, p, c) in enumerate(batch):
            ids[r, : len(p) + len(c)] = torch.tensor(p + c)
            mask[r, : len(p) + len(c)] = 1
        # the head runs where a choice's tokens are predicted only (position t predicts token t + 1): (N, V) logits,
        # not (B, T, V) (2 GB for 64 rows of 160 tokens at SmolLM2's 49,152 words)
        h = model(ids.to(device), attention_mask=mask.to(device), logits_to_keep=1).last_hidden_state  # (B, T, D)
        at = [(r, len(p) - 1 + k) for r, (_, _, p, c) in enumerate(batch) for k in range(len(c))]  # N positions
        if not at:  # every choice here encodes to no token: log-probability 0
            continue
        rows_at, cols_at = (torch.tensor(x, device=device) for x in zip(*at, strict=True))
        logits = model.head(h[rows_at, cols_at])  # (N, V)
        logits = logits if logits.dtype == torch.float64 else logits.float()
        targets = torch.tensor([t for _, _, _, c in batch for t in c], device=device)  # (N,)
        picked = F.log_softmax(logits, dim=-1).gather(1, targets[:, None])[:, 0]  # (N,)
        lengths = [len(c) for _, _, _, c in batch]  # each choice's tokens are the next len(c) of the N, in order
        for (i, j, _, c), part in zip(batch, picked.split(lengths), strict=True):
            out[i][j] = (float(part.sum()), len(c))
    return out


def greedy_replies(model: torch.nn.Module, fmt: ChatFormat, prompts: list[list[int]], max_new_tokens: int,
                   batch_size: int) -> list[str]:
    """The greedy reply to each prompt, batched on the decoding engine (each row independent of the others):
    ``batch_size`` requests decode together, the others wait for a free slot."""
    from lmforge.generation.lm import LM
    from lmforge.generation.requests import Request
    from lmforge.models.interfaces import generates_text, is_encoder_decoder, special_ids

    if not generates_text(model) or is_encoder_decoder(model):
        raise LmforgeError("--tasks: this model cannot generate replies (a decoder is needed)")
    room = model.config.max_positions
    longest = min(room, max(map(len, prompts)) + max_new_tokens)
    lm = LM(model, fmt.tokenizer, fmt, slots=min(batch_size, len(prompts)), capacity=longest)
    stops = special_ids(model, fmt.tokenizer).ending(fmt.stop_ids)  # as the server's and ``chat``'s replies
    generations = lm.run([Request(p, max_new_tokens=min(max_new_tokens, room - len(p)), stop_ids=stops)
                          for p in prompts])
    return [fmt.reply_text(g.tokens) for g in generations]


def bootstrap(stats: np.ndarray, score: Callable[[np.ndarray], float], seed: int) -> list[float]:
    """95% interval of ``score`` over resamples of the rows of ``stats`` (items x per-item statistics)."""
    rng = np.random.default_rng(seed)
    n = len(stats)
    draws = sorted(score(stats[rng.integers(0, n, n)]) for _ in range(RESAMPLES))
    return [round(draws[int(0.025 * RESAMPLES)], 4), round(draws[int(0.975 * RESAMPLES) - 1], 4)]


def mean(stats: np.ndarray) -> float:
    return float(stats.mean())


def score_choices(model, fmt, items, prompts, options) -> dict[str, Any]:
    scores = choice_logprobs(model, fmt, prompts, [i["choices"] for i in items], options.batch_size)
    correct = {}
    for norm in ("none", "tokens", "chars"):
        hits = []
        for item, choice_scores in zip(items, scores, strict=True):
            value = [s / (n if norm == "tokens" else len(c) if norm == "chars" else 1) if n else float("-inf")
                     for (s, n), c in zip(choice_scores, item["choices"], strict=True)]
            hits.append(float(item["choices"][int(np.argmax(value))] == item["answer"]))
        correct[norm] = np.array(hits)
    chosen = correct[options.normalization]
    return {"metric": "accuracy", "normalization": options.normalization, "score": round(mean(chosen), 4),
            "ci95": bootstrap(chosen, mean, options.seed),
            "accuracy": {k: round(mean(v), 4) for k, v in correct.items()},
            "chance": round(float(np.mean([1 / len(i["choices"]) for i in items])), 4)}


def score_answers(items, replies, options) -> dict[str, Any]:
    hits = np.array([float(normalize(r) in {normalize(a) for a in (i["answer"] if isinstance(i["answer"], list)
                                                                    else [i["answer"]])})
                     for i, r in zip(items, replies, strict=True)])
    return {"metric": "exact_match", "score": round(mean(hits), 4), "ci95": bootstrap(hits, mean, options.seed)}


def score_references(items, replies, options) -> dict[str, Any]:
    try:
        from sacrebleu.metrics import BLEU, CHRF
    except ImportError:
        raise LmforgeError("--tasks: reference items are scored with sacrebleu: pip install sacrebleu") from None
    refs = [i["reference"] for i in items]
    out: dict[str, Any] = {"metric": "chrf"}
    for name, metric in (("chrf", CHRF()), ("bleu", BLEU(effective_order=True))):
        stats = np.array(metric._extract_corpus_statistics(replies, [refs]), dtype=np.float64)  # (N, S)

        def corpus(rows: np.ndarray, m=metric) -> float:
            return float(m._compute_score_from_stats(list(rows.sum(0))).score)

        out[name] = {"score": round(corpus(stats), 2), "ci95": bootstrap(stats, corpus, options.seed)}
    out["score"], out["ci95"] = out["chrf"]["score"], out["chrf"]["ci95"]
    return out


def evaluate_tasks(model: torch.nn.Module, tok: Any, path: str | Path, options: Any,
                   fewshot: str | Path | None = None, examples: int = 5) -> dict[str, Any]:
    """Score ``model`` on one tasks file; the JSON line's fields (task, kind, score, ci95, ...)."""
    kind, items = read_items(path, options.limit)
    if kind == "reference":  # fail before the work, not after it
        score_references(items[:1], [""], options)
    if options.shots and not fewshot:
        raise LmforgeError("--shots: name the solved examples with --fewshot FILE (a train split)")
    fmt = ChatFormat(tok)
    shots = fewshot_turns(fewshot, options.shots, options.seed) if options.shots else []
    prompts = [fmt.prompt_ids(with_shots(i["messages"], shots)) for i in items]
    for n, ids in enumerate(prompts, 1):  # each prompt leaves room for a reply, or one line naming it
        check_room(len(ids), 1, model.config.max_positions, f"{path}: item {n}: messages")
    start = time.perf_counter()
    model.eval()
    if kind == "choices":
        result = score_choices(model, fmt, items, prompts, options)
        replies: Sequence[str] = []
    else:
        replies = greedy_replies(model, fmt, prompts, options.max_new_tokens, options.batch_size)
        result = (score_answers if kind == "answer" else score_references)(items, replies, options)
    path = Path(path)
    return {"task": path.parent.name if path.stem.startswith("test") else path.stem, "file": str(path),
            "kind": kind, "items": len(items), "shots": options.shots, **result,
            "seconds": round(time.perf_counter() - start, 2),
            "examples": [{"question": i["messages"][-1]["content"][-200:], "reply": r}
                         for i, r in zip(items[:examples], replies, strict=False)]}

