"""Instruction tuning at course scale: a tiny lmforge GPT learns to answer in a chat format.

A GPT with no chat template is given ChatML's layout by ``lmforge finetune --task chat``: its two markers
(<|im_start|>, <|im_end|>) become special tokens, the embedding grows by two rows started at the mean row,
and the loss falls on the assistant's replies only. The task: "what is 3 plus 4?" -> "7."; the sums of the
held-out questions never appear in training (held out by the pair of numbers, not by the wording).

    python examples/chat_sft_course.py          # about half a minute on 2 CPU cores

Printed: the eval loss per answer token before and after, and how many held-out questions it answers exactly.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from pathlib import Path

import torch

STEPS = 300


def conversations() -> tuple[list[dict], list[dict]]:
    """(train, held out): every pair a + b with a, b < 10, the held-out pairs chosen by a seed."""
    pairs = [(a, b) for a in range(10) for b in range(10)]
    random.Random(0).shuffle(pairs)

    def item(a: int, b: int) -> dict:
        return {"messages": [{"role": "user", "content": f"what is {a} plus {b}?"},
                             {"role": "assistant", "content": f"{a + b}."}]}

    return [item(a, b) for a, b in pairs[20:]], [item(a, b) for a, b in pairs[:20]]


def main(out: Path) -> dict:
    from lmforge import load
    from lmforge.models import Decoder, get_preset, save_pretrained
    from lmforge.tokenizers import ByteLevelBPETokenizer
    from lmforge.workflows.chat import chat
    from lmforge.workflows.finetune import FinetuneArgs, finetune

    torch.manual_seed(0)
    torch.set_num_threads(1)  # the same numbers on every machine
    train, held_out = conversations()
    for name, items in (("train.jsonl", train), ("dev.jsonl", held_out)):
        (out / name).write_text("".join(json.dumps(i) + "\n" for i in items))
    text = " ".join(m["content"] for c in train for m in c["messages"])
    words = ByteLevelBPETokenizer.train([text], 300, 1)  # no special tokens at all
    base = Decoder(get_preset("gpt-tiny", vocab_size=words.vocab_size, max_positions=64, dropout=0.0,
                              attention_dropout=0.0))
    save_pretrained(base, out / "gpt", words)
    report = finetune(FinetuneArgs(model=str(out / "gpt"), task="chat", train=str(out / "train.jsonl"),
                                   eval=str(out / "dev.jsonl"), strategy="full", max_steps=STEPS, batch_size=8,
                                   lr=3e-3, eval_every=STEPS // 3, max_len=64, out=str(out / "gpt-chat"),
                                   progress=False, seed=0))
    model, tok = load(out / "gpt-chat")
    right = sum(chat(model, tok, c["messages"][:1]) == c["messages"][1]["content"] for c in held_out)
    first, last = report["evals"][0]["eval_loss"], report["eval"]["eval_loss"]
    print(f"special tokens added: {report['tokens_added']} (embedding rows {words.vocab_size} -> {tok.vocab_size})")
    print(f"eval loss per answer token: {first:.2f} after {STEPS // 3} steps -> {last:.2f} after {STEPS}")
    print(f"held-out questions answered exactly: {right} of {len(held_out)}")
    print(f"what is 3 plus 4? -> {chat(model, tok, [{'role': 'user', 'content': 'what is 3 plus 4?'}])!r}")
    return {"first": first, "last": last, "right": right, "added": report["tokens_added"]}


if __name__ == "__main__":
    folder = Path(os.environ.get("LMFORGE_OUT") or tempfile.mkdtemp(prefix="chat-sft-"))
    main(folder)
