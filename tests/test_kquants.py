"""K-quant GGUF blocks (Q4_K, Q5_K, Q6_K: what ``Q4_K_M`` and ``Q5_K_M`` files hold) dequantize to the values the
``gguf`` package's own reference gives (it follows ggml-quants.c), block for block, on random blocks; and a GGUF
model whose matrices are Q6_K blocks loads as the float32 model those blocks stand for."""

from __future__ import annotations

import numpy as np
import pytest

from lmforge.interop.gguf_file import dequantize
from lmforge.interop.kquants import BYTES

gguf = pytest.importorskip("gguf", reason="the gguf package (dev extra) is the reference for the block layouts")


def random_blocks(kind: str, n: int, seed: int, scale: float = 0.05) -> np.ndarray:
    """``n`` blocks of random bytes whose float16 fields are finite scales (as a quantizer writes them)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n, BYTES[kind]), dtype=np.uint8)
    halves = [0, 2] if kind != "Q6_K" else [208]
    for at in halves:
        blocks[:, at: at + 2] = rng.uniform(-scale, scale, n).astype(np.float16).view(np.uint8).reshape(n, 2)
    return blocks


@pytest.mark.parametrize("kind", ["Q4_K", "Q5_K", "Q6_K"])
def test_k_blocks_dequantize_as_ggml(kind):
    blocks = random_blocks(kind, 64, seed=len(kind) + ord(kind[1]))
    ours = dequantize(blocks.reshape(-1), kind, (4, 16 * 256))  # 4 rows of 16 blocks
    ref = gguf.quants.dequantize(blocks.reshape(4, -1), gguf.GGMLQuantizationType[kind])  # (4, 4096)
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)
    assert np.abs(ours).max() > 0  # blocks that hold something


def k_quant_files(tmp_path, monkeypatch, kind: str, d_model: int = 256):
    """A small Llama written twice: with its matrices as random ``kind`` blocks (the gguf package has no K-quant
    quantizer: ``write_gguf`` is handed them in place of quantizing), and in F32 with the values the reference
    dequantizes those blocks to. (quantized file, F32 twin, the original model)."""
    import torch

    import lmforge.interop.gguf_write as writer
    from lmforge.interop.gguf import unpermute
    from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
    from lmforge.models import Decoder
    from lmforge.models.config import DecoderConfig
    from test_gguf import byte_tokenizer

    config = DecoderConfig(vocab_size=300, d_model=d_model, n_layers=1, n_heads=4, n_kv_heads=2, d_ff=256,
                           max_positions=64, dropout=0.0, attention_dropout=0.0, activation="swiglu", norm="rmsnorm",
                           positions="rotary", bias=False, rope_base=10000.0, bos_id=1, eos_id=2)
    model = Decoder(config).eval()
    hf_config, state = llama_config_from_decoder(config), llama_state_from_decoder(model.state_dict(), config)
    held: list[np.ndarray] = []  # what each quantized matrix of the file stands for, in writing order
    real, kind_id = gguf.quants.quantize, gguf.GGMLQuantizationType[kind]

    def k_blocks(values: np.ndarray, quant_kind) -> np.ndarray:
        if quant_kind != kind_id:
            return real(values, quant_kind)
        blocks = random_blocks(kind, values.size // 256, seed=len(held), scale=5e-4).reshape(len(values), -1)
        held.append(gguf.quants.dequantize(blocks, quant_kind).reshape(values.shape))
        return blocks

    monkeypatch.setattr(gguf.quants, "quantize", k_blocks)
    monkeypatch.setattr(writer, "WRITE_TYPES", (*writer.WRITE_TYPES, kind.lower()))
    monkeypatch.setitem(writer.FILE_TYPES, kind.lower(), {"Q6_K": 18, "Q4_K": 15}[kind])  # llama.cpp's ftypes
    quantized = writer.write_gguf(tmp_path / "k.gguf", hf_config, state, byte_tokenizer(), dtype=kind.lower())
    twin, matrices = {}, iter(held)
    for name, tensor in state.items():  # the file's values, in Hugging Face's row order
        if tensor.dim() != 2:
            twin[name] = tensor
            continue
        values = next(matrices)
        heads = hf_config["num_attention_heads"] if "q_proj" in name else hf_config["num_key_value_heads"]
        twin[name] = torch.from_numpy(unpermute(values, heads) if "q_proj" in name or "k_proj" in name
                                      else values)
    plain = writer.write_gguf(tmp_path / "f32.gguf", hf_config, twin, byte_tokenizer(), dtype="f32")
    assert held
    return quantized, plain, model


def test_a_model_with_k_quant_matrices_loads_as_the_weights_they_stand_for(tmp_path, monkeypatch):
    """A file whose matrices are Q6_K blocks and its F32 twin load to the same model, bit for bit."""
    import torch

    from lmforge.interop.gguf import load_gguf
    from lmforge.interop.gguf_file import read_header

    quantized, plain, model = k_quant_files(tmp_path, monkeypatch, "Q6_K")
    assert {t.kind for t in read_header(quantized).tensors} == {"Q6_K", "F32"}
    a, _ = load_gguf(quantized)
    b, _ = load_gguf(plain)
    assert a.state_dict().keys() == b.state_dict().keys()
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not torch.equal(a.state_dict()["tok_emb.weight"], model.state_dict()["tok_emb.weight"])  # the blocks'


def test_q4_k_matrices_load_as_int4_layers_of_their_own_integers(tmp_path, monkeypatch):
    """``--dtype int4`` keeps a Q4_K file's matrices as their integers (int4 groups of 32, never dequantized): each
    layer's dequantized weight is the block's value up to its scale and zero rounded to bfloat16, and the logits
    stay close to the F32 twin's."""
    import torch

    from lmforge.interop.gguf import load_gguf
    from lmforge.nn.quant import QuantizedLinear

    quantized, plain, _ = k_quant_files(tmp_path, monkeypatch, "Q4_K")
    a, _ = load_gguf(quantized, dtype="int4")
    b, _ = load_gguf(plain)
    layers = [m for m in a.modules() if isinstance(m, QuantizedLinear) and m.kind == "int4"]
    assert len(layers) == 4  # in_proj (q, k, v), out_proj, fc1 (gate, up), fc2 of the one layer
    ids = torch.tensor([[1, 5, 9, 200, 17, 3]])
    with torch.inference_mode():
        got, want = a(ids).logits, b(ids).logits
    assert torch.linalg.norm(got - want) / torch.linalg.norm(want) < 2e-2


def test_q4_k_blocks_are_int4_groups_of_32_as_they_stand():
    """A Q4_K matrix kept as integers: d q + m of each group of 32 is the block's value (ggml's), to float32
    rounding; the integers are 4-bit."""
    from lmforge.interop.kquants import q4_k_int4

    blocks = random_blocks("Q4_K", 32, seed=7)  # 4 rows of 8 blocks of 256: (4, 2048)
    q, d, m = q4_k_int4(blocks.reshape(-1), (4, 2048))
    assert q.shape == (4, 2048) and q.max() <= 15 and d.shape == m.shape == (4, 64)
    values = d.repeat(32, axis=1) * q.astype(np.float32) + m.repeat(32, axis=1)
    np.testing.assert_allclose(values, dequantize(blocks.reshape(-1), "Q4_K", (4, 2048)), rtol=1e-5, atol=1e-6)
