"""Instruction tuning: supervised fine-tuning of a decoder on conversations (``lmforge finetune --task chat``).

    lmforge finetune --task chat --model $(python -m lmforge.data.sources path smollm2) --train chat.jsonl \\
        --eval dev.jsonl --strategy lora --out runs/smollm2-sft

The conversations are rendered with the model's own chat template and the loss falls on the assistant's
tokens only (data/chat.py). Rows are packed (several conversations per row, attention kept inside each) or
padded (``--no-packing``). The four strategies (full, frozen = the LM head only, lora, adapter; models/
strategies.py) and everything fine-tuning has apply: checkpoints every ``--save-every`` steps and on SIGTERM
with the same command resuming, ``--eval-every`` with the lowest eval loss kept, early stopping, checksums.

A course-scale lmforge GPT has no chat template: one is given to it (ChatML's layout, ``COURSE_TEMPLATE``), its
three markers added to the tokenizer as special tokens and the embedding grown by as many rows, each started at
the mean embedding (so the new tokens start as an average token, not as noise). Such a model is saved whole.

The output loads wherever a model does: ``lmforge chat``, ``serve``, ``generate --chat``, ``evaluate --tasks``.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.data.chat import ChatSource, Encoded, encode_conversation, pack, read_conversations, unpacked
from lmforge.errors import LmforgeError
from lmforge.files import remove_tree, write_text_atomic
from lmforge.tokenizers.chat import ChatTemplate
from lmforge.workflows.finetune_args import REPORT_FILE, FinetuneArgs, micro_batches, train_config

COURSE_MARKERS = ("<|im_start|>", "<|im_end|>")
COURSE_TEMPLATE = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def load_decoder(path: str) -> tuple[nn.Module, Any]:
    from lmforge.interop.directories import load
    from lmforge.models.decoder import Decoder

    model, tok = load(path)
    if not isinstance(model, Decoder):
        raise LmforgeError(f"--model: {path} holds a {type(model).__name__}; --task chat tunes a decoder (GPT, "
                           "Llama-family)")
    if tok is None:
        raise LmforgeError(f"--model: {path} has no tokenizer")
    return model.train(), tok


def give_chat_format(model: nn.Module, tok: Any) -> int:
    """A model without a chat template gets the course template: its markers become special tokens and the
    embedding (and an untied head) grows by one row each, started at the mean row. Returns the rows added."""
    if tok.chat_template:
        return 0
    new = [t for t in COURSE_MARKERS if t not in tok.vocab]
    tok.add_special_tokens(COURSE_MARKERS)
    tok.set_role("eos", "<|im_end|>")
    tok.chat_template, tok.specials_in_text = COURSE_TEMPLATE, True
    grow_embeddings(model, tok.vocab_size)
    model.config.eos_id = tok.eos_id
    return len(new)


def grow_embeddings(model: nn.Module, vocab: int) -> None:
    """Embedding rows (and an untied head's) for ids up to ``vocab``, each new one the mean of the old rows."""
    old = model.tok_emb.weight
    if vocab <= old.shape[0]:
        model.config.vocab_size = max(model.config.vocab_size, vocab)
        return
    mean = old.detach().mean(0, keepdim=True)
    grown = nn.Embedding(vocab, old.shape[1]).to(old.device, old.dtype)
    with torch.no_grad():
        grown.weight[: old.shape[0]] = old
        grown.weight[old.shape[0]:] = mean
    model.tok_emb = grown
    head = model.lm_head.proj
    if model.config.tie_embeddings:
        model.lm_head.tie(grown)
    else:
        new_head = nn.Linear(head.in_features, vocab, bias=False).to(old.device, old.dtype)
        with torch.no_grad():
            new_head.weight[: head.out_features] = head.weight
            new_head.weight[head.out_features:] = head.weight.mean(0, keepdim=True)
        model.lm_head.proj = new_head
    model.config.vocab_size = vocab


def encode_all(template: ChatTemplate, tok: Any, path: str, limit: int, max_len: int) -> list[Encoded]:
    conversations = read_conversations(path)[: limit or None]
    return [encode_conversation(template, tok, c, max_len, f"{path}: conversation {i}")
            for i, c in enumerate(conversations, 1)]


def eval_loss(model: nn.Module, source: ChatSource) -> float:
    """Mean loss per assistant token over the evaluation rows (summed over rows, then divided: exact); the LM head
    runs on the assistant's positions only (``loss_only``), never on (B, T, V)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for batch in source.eval_batches():
        batch = {k: v.to(device) for k, v in batch.items()}
        n = int((batch["labels"][:, 1:] != -100).sum())
        if n:
            total += float(model(**batch, loss_only=True).loss) * n
            count += n
    return total / max(count, 1)


def finetune_chat(args: FinetuneArgs, out: Path) -> dict[str, Any]:
    """Train, evaluate and save an instruction-tuned decoder into ``out`` (the caller holds its lock)."""
    from lmforge.interop.directories import save_finetuned
    from lmforge.models.strategies import StrategySpec, apply_decoder_strategy
    from lmforge.nn.lora import LORA_TARGETS
    from lmforge.train.trainer import Trainer, seed_everything
    from lmforge.workflows.finetune_eval import (
        BestCheckpoint,
        LastStepClock,
        current_rss,
        memory_report,
        parameter_counts,
    )

    seed_everything(args.seed)
    from lmforge.interop.directories import weights_sha256

    base_sha256 = weights_sha256(Path(args.model))  # the weights about to be read: what an adapter records
    model, tok = load_decoder(args.model)
    added = give_chat_format(model, tok)
    template = ChatTemplate.for_tokenizer(tok, str(args.model))  # the template, tokens and budget chat uses
    max_len = min(args.max_len, model.config.max_positions)
    train_ex = encode_all(template, tok, args.train, args.limit, max_len)
    eval_ex = encode_all(template, tok, args.eval, 0, max_len) if args.eval else []
    dropped = sum(e.dropped for e in train_ex + eval_ex)
    if dropped:
        print(f"lmforge finetune: {dropped} messages dropped from the start of conversations over max_len "
              f"{max_len} (the replies kept)", file=sys.stderr)
    arrange = pack if args.packing else (lambda ex, _n: unpacked(ex))
    rows, eval_rows = arrange(train_ex, max_len), arrange(eval_ex, max_len)
    spec = StrategySpec(strategy=args.strategy, lora_r=args.lora_r, lora_alpha=args.lora_alpha,
                        lora_dropout=args.lora_dropout, lora_targets=list(args.lora_targets or LORA_TARGETS),
                        adapter_size=args.adapter_size)
    model = apply_decoder_strategy(model, spec)
    if args.activation_checkpointing:
        from lmforge.train.recompute import recompute_layers

        recompute_layers(model)
    pad = tok.pad_id if tok.pad_id is not None else (tok.eos_id or 0)
    micro, passes = micro_batches(args, max_len)  # the step's rows in passes of `micro` (less memory, same step)
    source = ChatSource(rows, micro, pad, args.seed, grad_accum=passes, eval_rows=eval_rows,
                        eval_batch_size=args.eval_batch_size)
    steps = args.max_steps or max(1, math.ceil(args.epochs * len(rows) / args.batch_size))
    config = train_config(args, steps, passes)
    best = None
    if args.eval_every and eval_rows:
        best = BestCheckpoint(model, lambda m: {"eval_loss": eval_loss(m, source)}, args.eval_every, "eval_loss",
                              args.early_stopping)
    from dataclasses import asdict

    from lmforge.workflows.finetune_args import FINETUNE

    recipe = {"finetune": {k: v for k, v in asdict(args).items() if k not in ("progress", "out")}}
    clock = LastStepClock()
    trainer = Trainer(model, source, config, out / "run", callbacks=[clock] + ([best] if best else []),
                      recipe=recipe, schema=FINETUNE, model_info={"task": "chat"},
                      forward_options={"loss_only": True},  # only the assistant's tokens are scored,
                      eval_options={"loss_only": True})  # in training and in evaluation
    rss_before, start = current_rss(), time.perf_counter()
    result = trainer.fit()
    train_s = (clock.last or time.perf_counter()) - start
    if not args.keep_checkpoints:
        remove_tree(out / "run" / "checkpoints")
    kept = {"best": best.restore_best(), "evals": best.evals,
            "stopped_early_at": result.step if result.step < steps else None} if best else {}
    tokens = sum(len(r.ids) for r in rows) * steps * args.batch_size / max(len(rows), 1)
    model.eval()
    with torch.no_grad():
        final = eval_loss(model, source) if eval_rows else None
    report = {"model": str(args.model), "task": "chat", "strategy": args.strategy, "packing": args.packing,
              "conversations": len(train_ex), "rows": len(rows), "steps": steps, "max_len": max_len,
              "rows_per_pass": micro,
              "messages_dropped": dropped, "tokens_added": added, "train_loss": result.loss,
              "eval": {"eval_loss": final, "eval_ppl": math.exp(final)} if final is not None else {},
              "train_time_s": round(train_s, 2), "tokens_per_s": round(tokens / max(train_s, 1e-9), 1),
              **kept, **parameter_counts(model), **memory_report(model, rss_before, trainer.device)}
    info = {"task": "chat", "strategy": args.strategy, "labels": [], "base_model": str(args.model),
            "base_model_sha256": base_sha256,
            "max_len": max_len, "mix": False,
            "lora": {"r": spec.lora_r, "alpha": spec.lora_alpha, "dropout": spec.lora_dropout,
                     "targets": list(spec.lora_targets)}, "adapter": {"size": spec.adapter_size}}
    report["checkpoint_bytes"] = save_finetuned(model.cpu(), tok, out, info, merge=args.merge or bool(added))
    write_text_atomic(out / REPORT_FILE, json.dumps(report, indent=1) + "\n")
    return report
