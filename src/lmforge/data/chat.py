"""Conversations for instruction tuning: (ids, labels) with the loss on the assistant's tokens only, and packing.

A conversation is rendered by the model's own chat template (tokenizers/chat.py). Every position gets the label
``IGNORE_INDEX`` except the assistant's replies and their end-of-turn marker (``ChatTemplate.assistant_spans``):
the model learns to answer, not to predict its user's questions or the template's headers::

    <|im_start|>user\\nWhat is 2 + 2?<|im_end|>\\n<|im_start|>assistant\\n4.<|im_end|>\\n
                                                                     ^^^^^^^^^^^^  the only labels

A conversation longer than ``max_len`` loses its oldest turns (never the last reply: if that alone does not fit,
it is refused); ``Encoded.dropped`` counts the messages dropped, for the log.

Packing puts several conversations in one row of ``max_len`` (first fit, in file order) with ``segment_ids``:
attention stays inside a conversation (block-diagonal causal masks, ``Decoder.forward(segment_ids=...)``) and
positions restart at each one, so a packed row computes what each conversation computes alone (tested: the same
loss to 1e-6).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.errors import LmforgeError
from lmforge.files import read_text_utf8
from lmforge.nn.loss import IGNORE_INDEX
from lmforge.tokenizers.chat import ChatTemplate, Message, messages_line


def prompt_completion(row: Any) -> Any:
    """``{"prompt", "completion"}`` as the two-message conversation it stands for; anything else as it is."""
    if isinstance(row, dict) and "prompt" in row and "completion" in row:
        return {"messages": [{"role": "user", "content": row["prompt"]},
                             {"role": "assistant", "content": row["completion"]}]}
    return row


def read_conversations(path: str | Path) -> list[list[Message]]:
    """JSON lines of ``{"messages": [...]}`` or ``{"prompt": ..., "completion": ...}``; each needs a reply."""
    out = []
    for n, line in enumerate(read_text_utf8(Path(path), "conversations file").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        messages = messages_line(line, where, '{"messages": [...]} or {"prompt": ..., "completion": ...}',
                                 prompt_completion)["messages"]
        if not any(m["role"] == "assistant" for m in messages):
            raise LmforgeError(f"{where}: a conversation without an assistant turn has nothing to learn")
        out.append(messages)
    if not out:
        raise LmforgeError(f"{path}: no conversations")
    return out


@dataclass
class Encoded:
    ids: list[int]
    labels: list[int]
    dropped: int = 0  # messages dropped from the start to fit max_len


def encode_conversation(template: ChatTemplate, tokenizer: Any, messages: Sequence[Message], max_len: int,
                        where: str = "conversation") -> Encoded:
    """Token ids of the rendered conversation and labels on its assistant spans only (IGNORE_INDEX elsewhere)."""
    messages = list(messages)
    system = messages[:1] if messages[0]["role"] == "system" else []
    turns, dropped = messages[len(system):], 0
    while True:
        chat = system + turns
        enc = template.encode(tokenizer, chat)  # as served: message text is plain text (ChatFormat.prompt_ids)
        if len(enc.ids) <= max_len:
            break
        # drop the oldest exchange (up to the next user turn) unless only the last reply would be left
        cut = next((i for i in range(1, len(turns)) if turns[i]["role"] == "user"), None)
        if cut is None or not any(m["role"] == "assistant" for m in turns[cut:]):
            raise LmforgeError(f"{where}: {len(enc.ids)} tokens, over max_len {max_len} even with only its last "
                               "exchange: raise max_len or shorten it")
        turns, dropped = turns[cut:], dropped + cut
    spans = template.assistant_spans(chat, tokenizer)  # in the text ``enc.offsets`` index
    labels = []
    for token, (start, _end) in zip(enc.ids, enc.offsets, strict=True):
        inside = any(a <= start < b for a, b in spans)  # the token starts inside a reply (or its end marker)
        labels.append(token if inside else IGNORE_INDEX)
    return Encoded(enc.ids, labels, dropped)


@dataclass
class Row:
    """One training row: ids, labels, and for packed rows the conversation each position belongs to."""

    ids: list[int]
    labels: list[int]
    segments: list[int]


def pack(examples: Sequence[Encoded], max_len: int) -> list[Row]:
    """Conversations placed into rows of at most ``max_len`` tokens, first fit in order; segment k = the k-th
    conversation of the row (1-based; 0 is padding)."""
    rows: list[Row] = []
    for ex in examples:
        row = next((r for r in rows if len(r.ids) + len(ex.ids) <= max_len), None)
        if row is None:
            row = Row([], [], [])
            rows.append(row)
        segment = (row.segments[-1] if row.segments else 0) + 1
        row.ids += ex.ids
        row.labels += ex.labels
        row.segments += [segment] * len(ex.ids)
    return rows


def unpacked(examples: Sequence[Encoded]) -> list[Row]:
    return [Row(list(e.ids), list(e.labels), [1] * len(e.ids)) for e in examples]


def collate(rows: Sequence[Row], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded tensors: input_ids, labels (IGNORE_INDEX on padding), segment_ids (0 on padding) and
    position_ids restarting at every conversation."""
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    segments = torch.zeros(len(rows), width, dtype=torch.long)
    positions = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        n = len(r.ids)
        ids[b, :n], labels[b, :n], segments[b, :n] = (torch.tensor(x) for x in (r.ids, r.labels, r.segments))
        starts = [i for i in range(n) if i == 0 or r.segments[i] != r.segments[i - 1]]
        for k, s in enumerate(starts):
            end = starts[k + 1] if k + 1 < len(starts) else n
            positions[b, s:end] = torch.arange(end - s)
    return {"input_ids": ids, "labels": labels, "segment_ids": segments, "position_ids": positions}


class ChatSource:
    """A ``BatchSource`` over rows: epoch e visits them in the permutation seeded by (seed, e); batches depend on
    (step, micro, rank) only, so a resumed run reads what the uninterrupted one would have."""

    def __init__(self, rows: Sequence[Row], batch_size: int, pad_id: int, seed: int = 0, grad_accum: int = 1,
                 eval_rows: Sequence[Row] = (), eval_batch_size: int = 16) -> None:
        self.rows, self.batch_size, self.pad_id, self.seed = list(rows), batch_size, pad_id, seed
        self.grad_accum, self.eval_rows, self.eval_batch_size = grad_accum, list(eval_rows), eval_batch_size
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            self._perms = {epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))}
        return self._perms[epoch]

    def batch(self, step: int, micro: int = 0, rank: int = 0, world_size: int = 1) -> dict[str, torch.Tensor]:
        n = len(self.rows)
        start = (((step - 1) * self.grad_accum + micro) * world_size + rank) * self.batch_size
        return collate([self.rows[self._perm(r // n)[r % n]] for r in range(start, start + self.batch_size)],
                       self.pad_id)

    def eval_batches(self) -> Iterator[dict[str, torch.Tensor]]:
        for i in range(0, len(self.eval_rows), self.eval_batch_size):
            yield collate(self.eval_rows[i:i + self.eval_batch_size], self.pad_id)
