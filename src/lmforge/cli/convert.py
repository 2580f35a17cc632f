"""``lmforge convert``: Hugging Face BERT / GPT-2 directories to lmforge model directories and back.

    lmforge convert --from-hf DIR --out DIR      config.json + model.safetensors + tokenizer files
    lmforge convert --to-hf DIR --out DIR        a directory transformers' from_pretrained loads
    lmforge convert --to-peft LORA --out DIR     a LoRA fine-tune as PEFT's adapter + a transformers base
    lmforge convert --merge LORA --out DIR       a LoRA fine-tune folded into one plain model directory

Prints one JSON object (source, output, architecture, parameters) on standard output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli.common import Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import Runtime

SETTINGS = Settings(Recipe({"runtime": Runtime}), flags=("runtime",))


def run_convert(args: argparse.Namespace) -> int:
    from lmforge.interop.huggingface import convert_from_hf, convert_to_hf, load_hf
    from lmforge.models.registry import count_parameters, load_pretrained
    from lmforge.outputs import RECORD_NAME, claim_output, record_output

    source = Path(args.from_hf or args.to_hf or args.to_peft or args.merge)
    to = "lmforge" if args.from_hf else "hf" if args.to_hf else "peft" if args.to_peft else "merged"
    identity = {"source": str(source.resolve()), "to": to}
    claim_output(args.out, "model", identity, args.overwrite, inputs=[source])
    if args.from_hf:
        source, out = args.from_hf, convert_from_hf(args.from_hf, args.out)
        model = load_pretrained(out)  # the written directory reads back
    elif args.to_peft:
        from lmforge.interop.peft import export_peft

        source, out = args.to_peft, export_peft(args.to_peft, args.out)
        model = load_hf(out / "base")
    elif args.merge:
        from lmforge.interop.peft import export_merged

        source, out = args.merge, export_merged(args.merge, args.out)
        model = load_pretrained(out)
    else:
        source, out = args.to_hf, convert_to_hf(args.to_hf, args.out)
        model = load_hf(out)
    record_output(out, "model", identity, [p.name for p in Path(out).iterdir()
                                          if p.is_file() and p.name not in (RECORD_NAME, ".lock")])
    print(json.dumps({"source": str(source), "output": str(out), "architecture": type(model).__name__,
                      "parameters": count_parameters(model, by_component=False)}))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert Hugging Face BERT/GPT-2 checkpoints to lmforge and back",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="DIR", help="a Hugging Face BERT or GPT-2 directory")
    src.add_argument("--to-hf", metavar="DIR", help="an lmforge Encoder or Decoder model directory")
    src.add_argument("--to-peft", metavar="DIR", help="a LoRA output of lmforge finetune -> PEFT's adapter layout "
                     "(adapter_config.json, adapter_model.safetensors) + the base as a transformers directory")
    src.add_argument("--merge", metavar="DIR", help="a LoRA output -> one plain model directory (LoRA folded in)")
    p.add_argument("--out", metavar="DIR", required=True, help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace a different model (or other output) in --out")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_convert)
