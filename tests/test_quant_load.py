"""Quantized weights where models are loaded: ``--dtype int8 | int4`` and GGUF's Q4_0 / Q4_1 kept as stored."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import lmforge
from lmforge.cli import main
from lmforge.errors import LmforgeError
from lmforge.generation import generate
from lmforge.interop.directories import check_dtype
from lmforge.interop.gguf import load_gguf, read_gguf
from lmforge.interop.gguf_file import int4_blocks
from lmforge.interop.gguf_write import write_gguf
from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
from lmforge.models import Decoder, build_model, get_preset
from lmforge.models.registry import save_pretrained
from lmforge.nn.quant import QuantizedLinear, quantize
from lmforge.reference.quant import quantized_linear
from test_gguf import byte_tokenizer, tiny_llama
from test_quant import product_bound


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (the shared fixture in conftest.py)."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A GPT-2-shaped tiny model with weights large enough that greedy choices are not near-ties."""
    tok = byte_tokenizer()
    config = get_preset("gpt-tiny", vocab_size=tok.vocab_size, eos_id=tok.eos_id)
    torch.manual_seed(0)
    model = Decoder(config).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
    folder = tmp_path_factory.mktemp("gpt")
    save_pretrained(model, folder, tokenizer=tok)
    return folder, model, tok


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_generate_dtype_quantizes_and_its_greedy_tokens_follow_fp32(model_dir, capsys, dtype):
    """The command's tokens are the Python API's on ``lmforge.load(..., dtype=)``; the first is fp32's, and
    the logits along them differ from fp32's by a fraction of their spread, root mean square (a random
    model: a bound, not bits; docs/models.md has SmolLM2's perplexity and greedy agreement)."""
    folder, model, tok = model_dir
    assert main(["generate", "--model", str(folder), "--prompt", "the cat", "--max-new-tokens", "8", "--json",
                 "--dtype", dtype]) == 0
    out = capsys.readouterr()
    ids = json.loads(out.out)["ids"]
    quantized, _ = lmforge.load(folder, dtype=dtype)
    assert sum(isinstance(m, QuantizedLinear) for m in quantized.modules()) == 9
    prompt = torch.tensor([tok.encode("the cat", add_special_tokens=False).ids])
    assert ids == generate(quantized, prompt, max_new_tokens=8).to_lists()[0]
    assert ids[0] == generate(model, prompt, max_new_tokens=1).to_lists()[0][0]
    with torch.no_grad():  # along the quantized model's tokens, its logits stay near fp32's
        both = torch.tensor([prompt[0].tolist() + ids])
        a, b = model(both).logits, quantized(both).logits
    assert (a - b).pow(2).mean().sqrt() < {"int8": 0.02, "int4": 0.3}[dtype] * a.std()


def test_embed_and_evaluate_load_quantized_weights(model_dir, tmp_path, capsys):
    """``embed --dtype int8`` (a BERT-shaped encoder, biases and all) gives the embeddings of the int8 model,
    near fp32's; ``evaluate --dtype int4`` scores text with the int4 model."""
    from lmforge.tokenizers import WordPieceTokenizer
    from lmforge.workflows.embed import embed

    texts = ["the king spoke to the queen", "a man and a woman walked home"]
    wp = WordPieceTokenizer.train(texts * 5, vocab_size=120, min_frequency=1)
    torch.manual_seed(0)
    bert = build_model(get_preset("bert-tiny", vocab_size=wp.vocab_size, max_positions=64)).eval()
    encoder = save_pretrained(bert, tmp_path / "bert", wp)
    assert main(["embed", "--model", str(encoder), "--dtype", "int8", "--out", str(tmp_path / "v.npy"), *texts]) == 0
    quantized, tok = lmforge.load(encoder, dtype="int8")
    assert any(isinstance(m, QuantizedLinear) for m in quantized.modules())
    got = np.load(tmp_path / "v.npy")
    np.testing.assert_array_equal(got, embed(quantized, tok, texts))
    floats = embed(*lmforge.load(encoder), texts)
    cosine = (got * floats).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(floats, axis=1)
    assert (cosine > 0.999).all()
    (tmp_path / "text.txt").write_text("the cat sat on the mat while the dog slept\n" * 4)
    capsys.readouterr()
    assert main(["evaluate", "--model", str(model_dir[0]), "--data", str(tmp_path / "text.txt"), "--dtype",
                 "int4"]) == 0
    assert "perplexity" in capsys.readouterr().out


def test_quantized_weights_are_refused_off_the_cpu_in_one_line():
    with pytest.raises(LmforgeError, match="--dtype int4: quantized weights run on the CPU only"):
        check_dtype("int4", torch.device("meta"))
    check_dtype("bf16", torch.device("meta"))


# -- GGUF ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=["q4_0", "q4_1-tied"])
def gguf_file(request, tmp_path_factory):
    """A tiny Llama in Q4_0 (its own head) or Q4_1 (the head tied to the embedding, as SmolLM2's)."""
    model = tiny_llama(tie=request.param.endswith("tied"))
    path = tmp_path_factory.mktemp("gguf") / f"m-{request.param}.gguf"
    write_gguf(path, llama_config_from_decoder(model.config), llama_state_from_decoder(model.state_dict(),
                                                                                        model.config),
               byte_tokenizer(), dtype=request.param[:4])
    return path


def test_q4_blocks_become_int4_layers_without_being_dequantized(gguf_file, monkeypatch):
    import lmforge.interop.gguf as module

    read = []
    dequantize = module.dequantize
    monkeypatch.setattr(module, "dequantize", lambda raw, kind, shape: read.append(kind) or
                        dequantize(raw, kind, shape))
    model, _ = load_gguf(gguf_file, dtype="int4")
    tied = gguf_file.stem.endswith("tied")
    layers = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear) and m.kind == "int4"}
    assert len(layers) == 2 * 4 and all(m.group == 32 for m in layers.values())
    assert not any(isinstance(m, nn.Linear) for m in model.modules())  # the head: int8 (quantize's rule)
    # the norms; an untied model's embedding (a lookup) and head: a 4-bit file's vocabulary matrices are Q8_0
    # (``write_gguf``), and a tied one's is the int8 head as stored, never dequantized
    assert sorted(read) == ["F32"] * (2 * 2 + 1) + ([] if tied else ["Q8_0"] * 2)
    assert model.lm_head.proj.kind == "int8"  # tied: the file's Q8_0 integers, whose rows the lookups read;
    assert (getattr(model.tok_emb, "head", None) is model.lm_head.proj) == tied  # untied: its matrix quantized


def test_an_int4_layer_from_q4_blocks_gives_the_dequantized_weights_product(gguf_file):
    """Against the float64 product of the file's weights dequantized as llama.cpp does (x = d q + m): the
    kernel's rounding (``product_bound``) plus the move of d and m + 8 d from float16 to bfloat16, at most
    2^-8 (8 d + |m + 8 d|) a weight."""
    model, _ = load_gguf(gguf_file, dtype="int4")
    floats, _ = load_gguf(gguf_file)
    file = read_gguf(gguf_file)
    raw = {t.name: t for t in file.file.tensors}
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(1))
    for name, layer in [("layers.0.ffn.fc2", "blk.0.ffn_down.weight"),
                        ("layers.1.self_attn.out_proj", "blk.1.attn_output.weight")]:
        q4 = model.get_submodule(name)
        w = floats.get_submodule(name).weight.detach().double().numpy()  # (N, K) as llama.cpp dequantizes it
        k = w.shape[1]
        xs = x[:, :k].double().numpy()
        ref = quantized_linear(xs, w)
        t = raw[layer]
        _, d, m = int4_blocks(file.file.raw(t), t.kind, tuple(reversed(t.shape)))
        z = m + 8 * d if t.kind == "Q4_1" else m
        moved = 2 ** -8 * (8 * np.abs(d) + np.abs(z))  # (N, K/32): how far a weight may move
        bound = product_bound(xs, w, ref) + np.abs(xs) @ np.repeat(moved, 32, axis=1).T
        y = q4(x[:, :k]).double().numpy()
        assert (np.abs(y - ref) <= bound).all(), name
        assert 0 < np.abs(y - ref).max() < 0.5 * bound.max()
    ids = torch.randint(3, 250, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = floats(ids).logits, model(ids).logits
    assert (a - b).abs().max() < 0.1 * a.std()  # bfloat16 activations in every product


def test_load_with_dtype_int4_keeps_a_gguf_q4_file_as_stored(gguf_file):
    """``lmforge.load(file, dtype="int4")`` uses the file's integers; another group size requantizes."""
    as_stored, _ = lmforge.load(gguf_file, dtype="int4")
    direct, _ = load_gguf(gguf_file, dtype="int4")
    layers = [(name, m) for name, m in direct.named_modules() if isinstance(m, QuantizedLinear) and m.kind == "int4"]
    assert len(layers) == 8
    for name, layer in layers:
        other = as_stored.get_submodule(name)
        assert torch.equal(other.weight, layer.weight) and torch.equal(other.scales, layer.scales), name
    assert as_stored.lm_head.proj.kind == "int8"  # the head: the file's Q8_0 rows, or read as float32, then int8
    regrouped, _ = lmforge.load(gguf_file, dtype="int4", group_size=64)
    assert regrouped.get_submodule("layers.0.ffn.fc1").group == 64


@pytest.mark.parametrize(("written", "dtype", "group"), [("f32", "int8", 32), ("q8_0", "int4", 32),
                                                          ("q8_0", "int8", 32), ("q4_1", "int8", 64),
                                                          ("f32", "int4", 64)])
def test_a_gguf_load_quantizes_each_layer_as_it_reads_it_as_quantize_would(written, dtype, group, tmp_path):
    """``load(file, dtype=int8 | int4)`` quantizes each block matrix as it is read (no float32 model: the peak
    is tests/test_loading.py's): every layer the same bits as the float32 load quantized whole, the same layers
    left float (a shape the kernels cannot hold), and the same logits where the head is made the same way."""
    model = tiny_llama(tie=True)
    path = write_gguf(tmp_path / f"m-{written}.gguf", llama_config_from_decoder(model.config),
                      llama_state_from_decoder(model.state_dict(), model.config), byte_tokenizer(), dtype=written)
    streamed, _ = lmforge.load(path, dtype=dtype, group_size=group)
    whole, _ = load_gguf(path)
    quantize(whole, dtype, group)
    kinds = {name: type(m).__name__ for name, m in whole.named_modules() if name.startswith("layers.")}
    assert kinds == {name: type(m).__name__ for name, m in streamed.named_modules() if name.startswith("layers.")}
    compared = 0
    for name, layer in whole.named_modules():
        if name.startswith("layers.") and isinstance(layer, QuantizedLinear):
            other = streamed.get_submodule(name)
            assert torch.equal(other.weight, layer.weight) and torch.equal(other.scales, layer.scales), name
            compared += 1
    assert compared >= 4  # every block's in_proj and out_proj (and fc1, fc2 where the group fits)
    if not (written == "q8_0" and group == 32):  # else the head is the file's own Q8_0 integers (kept as stored)
        ids = torch.tensor([[1, 5, 9, 200, 3]])
        with torch.no_grad():
            assert torch.equal(streamed(ids).logits, whole(ids).logits)


# -- convert --quantize ------------------------------------------------------------------------------------------
def test_the_portable_form_rebuilds_the_same_layer():
    for kind in ("int8", "int4"):
        layer = QuantizedLinear.from_linear(nn.Linear(64, 48), kind)
        again = QuantizedLinear.from_portable(kind, *layer.portable())
        assert torch.equal(again.weight, layer.weight) and torch.equal(again.scales, layer.scales), kind
        assert torch.equal(again.integers(), layer.integers())


@pytest.mark.parametrize("source", ["directory", "gguf"])
def test_convert_quantize_writes_a_checksummed_directory_that_loads_back_to_identical_layers(
        source, model_dir, tmp_path, capsys):
    """From a model directory, or a GGUF file (its Q4_1 kept as stored): the written directory (checksums
    verified on load) gives the layers, and so the logits, of ``lmforge.load(source, dtype="int4")``."""
    if source == "gguf":
        model = tiny_llama(tie=True)
        path = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                          llama_state_from_decoder(model.state_dict(), model.config), byte_tokenizer(), dtype="q4_1")
    else:
        path = model_dir[0]
    assert main(["convert", "--quantize", str(path), "--out", str(tmp_path / "q")]) != 0
    assert "--quantize: give --dtype int8 or --dtype int4" in capsys.readouterr().err
    assert main(["convert", "--quantize", str(path), "--dtype", "int4", "--out", str(tmp_path / "q")]) == 0
    capsys.readouterr()
    assert "model.safetensors" in json.loads((tmp_path / "q" / "checksums.json").read_text())["files"]
    back, tok = lmforge.load(tmp_path / "q")
    direct, _ = lmforge.load(path, dtype="int4")
    layers = [(name, m) for name, m in direct.named_modules() if isinstance(m, QuantizedLinear)]
    assert len(layers) == 9 and direct.get_submodule("lm_head.proj").activations == 8  # an int4 model's head
    for name, layer in layers:
        other = back.get_submodule(name)
        assert (other.kind, other.group, other.activations) == (layer.kind, layer.group, layer.activations)
        assert torch.equal(other.weight, layer.weight) and torch.equal(other.scales, layer.scales), name
    ids = torch.randint(3, 250, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, direct(ids).logits)
    assert tok is not None


def test_serve_opens_the_model_quantized(model_dir):
    from lmforge.workflows.options import ServeOptions, Weights
    from lmforge.workflows.serving import ModelService

    service = ModelService.open(model_dir[0], ServeOptions(slots=2), engine_thread=False,
                                weights=Weights(dtype="int4"))
    assert sum(isinstance(m, QuantizedLinear) for m in service.model.modules()) == 9
    assert service.lm.engine.runner.packed  # exact rows a step; the quantized layers are not packed again
