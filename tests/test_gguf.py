"""GGUF in and out (interop/gguf.py): dequantization, the row permutation, the tokenizer, export both ways; and
SmolLM2-135M-Instruct against transformers loaded from the same file (slow)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lmforge.errors import LmforgeError
from lmforge.interop.gguf import dequantize, load_gguf, permute, read_gguf, unpermute
from lmforge.interop.gguf_write import write_gguf
from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
from lmforge.models import Decoder
from lmforge.models.config import DecoderConfig

gguf = pytest.importorskip("gguf", reason="the gguf package (lmforge[gguf], in the dev extra) reads GGUF files")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(single_thread):
    """One torch thread (conftest.py)."""


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_dequantize_equals_the_gguf_package(kind):
    g = np.random.default_rng(0)
    values = (g.standard_normal((8, 64)) * 3).astype(np.float32)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raw = gguf.quants.quantize(values, qtype)
    expected = gguf.quants.dequantize(raw, qtype).reshape(values.shape)
    got = dequantize(np.asarray(raw), kind, values.shape)
    np.testing.assert_array_equal(got, expected)
    relative = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 1e-2, "Q4_0": 0.15, "Q4_1": 0.1}[kind]
    assert np.abs(got - values).max() <= relative * np.abs(values).max() + 1e-12  # the format's own error


def test_permute_and_unpermute_are_inverse_and_pair_the_halves():
    w = np.arange(2 * 8 * 3).reshape(16, 3)  # two heads of 8 rows
    assert np.array_equal(unpermute(permute(w, 2), 2), w)
    assert permute(w, 2)[:4, 0].tolist() == [0, 12, 3, 15]  # head 0: rows 0, 4, 1, 5 (halves interleaved)


def tiny_llama(tie: bool = True, seed: int = 0) -> Decoder:
    torch.manual_seed(seed)
    config = DecoderConfig(vocab_size=300, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=96,
                           max_positions=128, dropout=0.0, attention_dropout=0.0, activation="swiglu", norm="rmsnorm",
                           positions="rotary", bias=False, rope_base=100000.0, tie_embeddings=tie, bos_id=1, eos_id=2)
    model = Decoder(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1 if p.dim() > 1 else 1.0)
    return model


def byte_tokenizer():
    from lmforge.tokenizers import ByteLevelBPETokenizer

    text = ("hello world, the cat sat on the mat while the dog slept under the old oak tree in the garden; "
            "quick brown foxes jumped over lazy dogs and everyone laughed about it for hours") * 5
    tok = ByteLevelBPETokenizer.train([text], 300, 1, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    assert tok.vocab_size == 300  # the model's vocabulary: the GGUF lists one token per embedding row
    tok.set_role("bos", "<|im_start|>")
    tok.set_role("eos", "<|im_end|>")
    return tok


@pytest.mark.parametrize(("tie", "dtype", "tolerance"), [(True, "f32", 0.0), (False, "f32", 0.0),
                                                        (True, "f16", 2e-3), (True, "q8_0", 2e-2)])
def test_write_then_read_gives_the_same_model(tmp_path, tie, dtype, tolerance):
    model, tok = tiny_llama(tie), byte_tokenizer()
    path = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                      llama_state_from_decoder(model.state_dict(), model.config), tok, "{{ messages }}", dtype)
    back, tok2 = load_gguf(path)
    for name, tensor in model.state_dict().items():
        np.testing.assert_allclose(back.state_dict()[name], tensor, atol=tolerance * float(tensor.abs().max()) + 1e-7)
    assert tok2.id_to_token[: tok.vocab_size] == tok.id_to_token and tok2.chat_template == "{{ messages }}"
    assert tok2.encode("hello <|im_end|>", add_special_tokens=False).ids == \
        tok.encode("hello <|im_end|>", add_special_tokens=False, allow_special=True).ids
    assert (tok2.bos_id, tok2.eos_id) == (tok.bos_id, tok.eos_id)
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically


def test_transformers_reads_the_written_file_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, tok = tiny_llama(tie=False), byte_tokenizer()
    write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
               llama_state_from_decoder(model.state_dict(), model.config), tok, dtype="f32")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="m.gguf", dtype=torch.float32).eval()
    ids = torch.randint(3, 250, (1, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, model(ids).logits, atol=1e-4, rtol=0)
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    text = "hello world, <|im_start|>the cat"
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == \
        tok.encode(text, add_special_tokens=False, allow_special=True).ids


def test_bad_files_are_one_line(tmp_path):
    model, tok = tiny_llama(), byte_tokenizer()
    good = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                      llama_state_from_decoder(model.state_dict(), model.config), tok, dtype="f32")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(good.read_bytes()[:-1000])
    with pytest.raises(LmforgeError, match=r"cut\.gguf: tensor [a-z_.0-9]+: truncated"):
        read_gguf(truncated)
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(LmforgeError, match=r"junk\.gguf: not a readable GGUF file"):
        read_gguf(tmp_path / "junk.gguf")
    other = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    other.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    other.write_header_to_file(), other.write_kv_data_to_file(), other.write_tensors_to_file(), other.close()
    with pytest.raises(LmforgeError, match=r"architecture 'bert' is not supported"):
        read_gguf(tmp_path / "bert.gguf")
    with pytest.raises(LmforgeError, match="q4_k"):
        write_gguf(tmp_path / "x.gguf", llama_config_from_decoder(model.config), {}, tok, dtype="q4_k")


def test_an_unsupported_tensor_type_names_the_tensor(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    for key, value in [("block_count", 1), ("embedding_length", 32), ("feed_forward_length", 64),
                       ("attention.head_count", 2), ("attention.layer_norm_rms_epsilon", 1e-5)]:
        getattr(w, {"block_count": "add_block_count", "embedding_length": "add_embedding_length",
                    "feed_forward_length": "add_feed_forward_length", "attention.head_count": "add_head_count",
                    "attention.layer_norm_rms_epsilon": "add_layer_norm_rms_eps"}[key])(value)
    w.add_vocab_size(256)
    values = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    w.add_tensor("token_embd.weight", gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q5_0),
                 raw_dtype=gguf.GGMLQuantizationType.Q5_0)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(LmforgeError, match=r"tensor token_embd\.weight is of type Q5_0"):
        read_gguf(tmp_path / "q.gguf").tensors()


# -- SmolLM2-135M-Instruct against transformers, from the same file ----------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    from lmforge.data.sources import smollm2_path

    path = smollm2_path()
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    ours, tok = load_gguf(path)
    return path, ours, tok, hf, hf_tok


MIXED = ("The quick brown fox — naïve café, 12345 + 678 = 13023!\n\n    def f(x):\n        return x ** 2  # 😀 日本語\n"
         "<|im_start|>user\nHi<|im_end|>  trailing   spaces\tand tabs")


@pytest.mark.slow
def test_smollm2_tensors_and_tokenizer_equal_transformers(smollm2):
    _, ours, tok, hf, hf_tok = smollm2
    theirs = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    from lmforge.interop.llama import llama_state_from_decoder

    for name, tensor in llama_state_from_decoder(ours.state_dict(), ours.config).items():
        torch.testing.assert_close(tensor, theirs[name.removeprefix("model.")], atol=0, rtol=0)
    assert tok.encode(MIXED, add_special_tokens=False).ids == hf_tok(MIXED, add_special_tokens=False)["input_ids"]
    ids = tok.encode(MIXED, add_special_tokens=False).ids
    assert tok.decode(ids) == hf_tok.decode(ids)


@pytest.mark.slow
def test_smollm2_logits_and_greedy_text_equal_transformers(smollm2):
    from lmforge.data.sources import shakespeare_text
    from lmforge.generation import generate

    _, ours, tok, hf, _ = smollm2
    ids = torch.tensor([tok.encode(shakespeare_text()[20000:23000], add_special_tokens=False).ids[:512]])
    with torch.no_grad():
        difference = (ours(ids).logits - hf(ids).logits).abs().max().item()
    assert difference <= 1e-4, difference
    prompt = ids[:, :24]
    with torch.no_grad():
        expected = hf.generate(prompt, max_new_tokens=64, do_sample=False, min_new_tokens=64)[:, 24:]
    assert generate(ours, prompt, max_new_tokens=64, stop_ids=[]).tokens.tolist() == expected.tolist()


@pytest.mark.slow
def test_smollm2_answers_the_oracle_question(smollm2):
    from lmforge.workflows.chat import chat

    _, ours, tok, _, _ = smollm2
    question = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    assert chat(ours, tok, question) == "The capital of France is Paris."


def test_convert_from_and_to_gguf_on_the_command_line(tmp_path, capsys):
    import json

    import lmforge
    from lmforge.cli import main
    from lmforge.manifest import read_manifest

    model, tok = tiny_llama(tie=False), byte_tokenizer()
    source = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                        llama_state_from_decoder(model.state_dict(), model.config), tok, "{{ messages }}", "f32")
    assert main(["convert", "--from-gguf", str(source), "--out", str(tmp_path / "dir")]) == 0
    assert json.loads(capsys.readouterr().out)["architecture"] == "Decoder"
    assert {"model.safetensors", "tokenizer.json", "config.json"} <= set(read_manifest(tmp_path / "dir"))
    assert main(["convert", "--to-gguf", str(tmp_path / "dir"), "--out", str(tmp_path / "back.gguf"),
                 "--gguf-type", "f32"]) == 0
    (converted, tok2), (back, _) = lmforge.load(tmp_path / "dir"), lmforge.load(tmp_path / "back.gguf")
    ids = torch.randint(3, 250, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = model(ids).logits
        assert torch.equal(converted(ids).logits, expected) and torch.equal(back(ids).logits, expected)
    assert tok2.chat_template == "{{ messages }}"
    assert main(["convert", "--to-gguf", str(tmp_path / "dir"), "--out", str(tmp_path / "x.bin")]) == 2
