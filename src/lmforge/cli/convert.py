"""``lmforge convert``: model directories in and out of Hugging Face, PEFT and GGUF.

    lmforge convert --from-hf DIR --out DIR        HF BERT / GPT-2 / Llama folder -> lmforge directory
    lmforge convert --to-hf DIR --out DIR          lmforge Encoder / Decoder (GPT-2 or Llama-shaped) -> HF folder
    lmforge convert --from-gguf FILE --out DIR     a Llama-family GGUF file -> lmforge directory (checksummed)
    lmforge convert --to-gguf DIR --out FILE.gguf  a Llama-shaped decoder -> GGUF (--gguf-type f32 ... q4_1)
    lmforge convert --to-peft LORA --out DIR       a LoRA fine-tune as PEFT's adapter + a transformers base
    lmforge convert --merge LORA --out DIR         a LoRA fine-tune folded into one plain model directory
    lmforge convert --quantize DIR --dtype int4 --out DIR   any model (or GGUF file) -> int8 / int4 layers

Prints one JSON object (source, output, architecture, parameters) on standard output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lmforge.cli.common import OVERWRITE_HELP, Settings, add_quiet, add_settings
from lmforge.schema import Recipe
from lmforge.workflows.options import ConvertOptions, Runtime, Weights

SETTINGS = Settings(Recipe({"convert": ConvertOptions, "runtime": Runtime, "weights": Weights}),
                    flags=("convert", "runtime", "weights"), exclude=("runtime.device",))


def run_convert(args: argparse.Namespace) -> int:
    from lmforge.workflows.convert import convert

    source = args.from_hf or args.to_hf or args.to_peft or args.merge or args.from_gguf or args.to_gguf or \
        args.quantize
    to = ("lmforge" if args.from_hf or args.from_gguf else "hf" if args.to_hf else "peft" if args.to_peft else
          "gguf" if args.to_gguf else "quantized" if args.quantize else "merged")
    report = convert(Path(source), to, Path(args.out), args.settings["convert"], args.overwrite,
                     args.settings["weights"])
    print(json.dumps(report))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert models: Hugging Face, GGUF, PEFT and lmforge directories",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-hf", metavar="DIR", help="a Hugging Face BERT, GPT-2 or Llama-family directory")
    src.add_argument("--to-hf", metavar="DIR", help="an lmforge Encoder or Decoder model directory")
    src.add_argument("--from-gguf", metavar="FILE", help="a Llama-family GGUF file (llama.cpp, Ollama)")
    src.add_argument("--to-gguf", metavar="DIR", help="an lmforge Llama-shaped decoder directory")
    src.add_argument("--to-peft", metavar="DIR", help="a LoRA output of lmforge finetune -> PEFT's adapter layout "
                     "(adapter_config.json, adapter_model.safetensors) + the base as a transformers directory")
    src.add_argument("--merge", metavar="DIR", help="a LoRA output -> one plain model directory (LoRA folded in)")
    src.add_argument("--quantize", metavar="DIR", help="any model directory or GGUF file -> an lmforge directory "
                     "of weight-only quantized layers: --dtype int8 | int4 (a GGUF's Q4_0 / Q4_1 kept as stored)")
    p.add_argument("--out", metavar="PATH", required=True, help="output directory (a .gguf file for --to-gguf)")
    p.add_argument("--overwrite", action="store_true", help=f"{OVERWRITE_HELP}; for --to-gguf: replace an existing "
                   "FILE.gguf (without it an existing file is refused before any work)")
    add_settings(p, SETTINGS)
    add_quiet(p)
    p.set_defaults(handler=run_convert)
