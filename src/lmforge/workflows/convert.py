"""``lmforge convert`` as a function: one source, one direction, one output that claims its place.

    convert(Path("model.gguf"), "lmforge", Path("runs/smollm2"), ConvertOptions())     # -> report dict

Directions: ``lmforge`` (from a Hugging Face folder or a GGUF file), ``hf``, ``gguf``, ``peft``, ``merged``.
Every output ends with its checksums (or is one atomic file, for GGUF), and an output that would replace its own
input or another artefact is refused (``lmforge.outputs``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmforge.errors import LmforgeError
from lmforge.workflows.options import ConvertOptions, Weights


def convert(source: Path, to: str, out: Path, options: ConvertOptions, overwrite: bool = False,
            weights: Weights | None = None) -> dict[str, Any]:
    from lmforge.models.registry import count_parameters
    from lmforge.outputs import claim_file, claim_output

    if to == "quantized" and (weights is None or weights.dtype not in ("int8", "int4")):
        raise LmforgeError("--quantize: give --dtype int8 or --dtype int4 (the layers' format)")
    if to == "gguf" and out.suffix != ".gguf":
        raise LmforgeError(f"--out: {out} must end in .gguf for --to-gguf")
    # the output is claimed before anything is read: a refusal costs nothing and changes nothing
    claim = (claim_file(out, overwrite, inputs=[source]) if to == "gguf" else
             claim_output(out, "model", {"source": str(source.resolve()), "to": to}, overwrite, inputs=[source]))
    if source.is_dir():  # verified before it is read: a directory lmforge.load refuses does not convert either
        from lmforge.interop.directories import verify_directory
        from lmforge.train.logs import info

        if not verify_directory(source):
            info(f"{source}: no checksums.json; its files are checked only as their formats allow")
    if to == "gguf":
        model = gguf_out(source, out, options)
        return {"source": str(source), "output": str(out), "architecture": type(model).__name__,
                "parameters": count_parameters(model, by_component=False), "gguf_type": options.gguf_type}
    with claim:
        model, out = quantized_out(source, weights, out) if to == "quantized" else write_model(source, to, out)
    return {"source": str(source), "output": str(out), "architecture": type(model).__name__,
            "parameters": count_parameters(model, by_component=False)}


def write_model(source: Path, to: str, out: Path):
    """(the model as written, read back; the output folder) for the directions that write a folder."""
    from lmforge.interop.huggingface import convert_from_hf, convert_to_hf, load_hf
    from lmforge.models.registry import load_pretrained

    if to == "lmforge" and source.suffix == ".gguf":
        return gguf_in(source, out), out
    if to == "lmforge":
        out = convert_from_hf(source, out)
        return load_pretrained(out), out  # the written directory reads back
    if to == "peft":
        from lmforge.interop.peft import export_peft

        out = export_peft(source, out)
        return load_hf(out / "base"), out
    if to == "merged":
        from lmforge.interop.peft import export_merged

        out = export_merged(source, out)
        return load_pretrained(out), out
    out = convert_to_hf(source, out)
    return load_hf(out), out


def gguf_in(source: Path, out: Path):
    """A GGUF file -> an lmforge directory: config.json, model.safetensors, tokenizer.json (its chat template
    inside), checksums.json."""
    from lmforge.interop.gguf import load_gguf
    from lmforge.models.registry import save_pretrained

    model, tokenizer = load_gguf(source)
    save_pretrained(model, out, tokenizer)
    return model


def quantized_out(source: Path, weights: Weights, out: Path):
    """Any model ``lmforge.load`` reads (a GGUF file's Q4_0 / Q4_1 kept as stored with int4) -> an lmforge
    directory of int8 / int4 layers (nn.quant; config.json's ``quantized`` names them), checksummed; read back."""
    from lmforge.interop.directories import load
    from lmforge.models.registry import load_pretrained, save_pretrained

    model, tokenizer = load(source, dtype=weights.dtype, group_size=weights.group_size)
    save_pretrained(model, out, tokenizer)
    return load_pretrained(out), out


def gguf_out(source: Path, out: Path, options: ConvertOptions):
    """An lmforge Llama-shaped decoder directory -> one GGUF file (atomic), its tokenizer and chat template in it."""
    from lmforge.interop.directories import load
    from lmforge.interop.gguf_write import write_gguf
    from lmforge.interop.huggingface import unpadded
    from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
    from lmforge.models.decoder import Decoder
    from lmforge.models.registry import state_dict_untied

    model, tokenizer = load(source)
    if not isinstance(model, Decoder):
        raise LmforgeError(f"--to-gguf: {source} holds a {type(model).__name__}; GGUF export takes a decoder")
    if tokenizer is None:
        raise LmforgeError(f"--to-gguf: {source} has no tokenizer (a GGUF file carries one)")
    hf_config = llama_config_from_decoder(model.config)
    state = llama_state_from_decoder(unpadded(state_dict_untied(model), model.config), model.config)
    write_gguf(out, hf_config, state, tokenizer, tokenizer.chat_template, options.gguf_type, name=source.name)
    return model
