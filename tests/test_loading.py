"""A model loads in the memory of its file (models/unwritten.py, interop/gguf.py, models/registry.py): no weight is
initialised only to be overwritten, the file's tensors become the parameters (safetensors stay memory-mapped, a
GGUF is read one tensor at a time), and the logits are those of a copy into an initialised model, bit for bit."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch.overrides import TorchFunctionMode

import lmforge
from lmforge.interop.llama import llama_config_from_decoder, llama_state_from_decoder
from lmforge.models import Decoder
from lmforge.models.config import DecoderConfig
from lmforge.models.registry import WEIGHTS_NAME, load_weights, read_weights, save_pretrained, untied
from lmforge.models.unwritten import unwritten

SRC = Path(lmforge.__file__).resolve().parents[1]  # the lmforge under test, for the measuring process
INITIALISERS = ("normal_", "uniform_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_", "trunc_normal_")


def llama(vocab: int = 300, d: int = 64, layers: int = 2, d_ff: int = 96, tie: bool = True,
          positions: int = 128) -> Decoder:
    torch.manual_seed(0)
    config = DecoderConfig(vocab_size=vocab, d_model=d, n_layers=layers, n_heads=4, n_kv_heads=2, d_ff=d_ff,
                           max_positions=positions, dropout=0.0, attention_dropout=0.0, activation="swiglu",
                           norm="rmsnorm", positions="rotary", bias=False, rope_base=100000.0, tie_embeddings=tie,
                           bos_id=1, eos_id=2)
    return Decoder(config).eval()


def byte_tokenizer(vocab: int = 300):
    from lmforge.tokenizers import ByteLevelBPETokenizer

    text = "the cat sat on the mat while the dog slept under the old oak tree in the garden " * 20
    tok = ByteLevelBPETokenizer.train([text], vocab, 1, special_tokens=["<|endoftext|>"])
    return tok


def write_gguf_model(model: Decoder, path: Path, kind: str = "f32") -> Path:
    pytest.importorskip("gguf", reason="the gguf package (lmforge[gguf], in the dev extra) writes GGUF files")
    from lmforge.interop.gguf_write import write_gguf

    return write_gguf(path, llama_config_from_decoder(model.config),
                      llama_state_from_decoder(model.state_dict(), model.config), byte_tokenizer(), None, kind)


def write_hf_llama(model: Decoder, folder: Path) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(llama_config_from_decoder(model.config)))
    save_file(untied(llama_state_from_decoder(model.state_dict(), model.config)), str(folder / WEIGHTS_NAME))
    return folder


class CountInitialisers(TorchFunctionMode):
    """Counts the random initialisers that reach torch (nn.init's and the Tensor methods they call)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in INITIALISERS:
            self.calls[func.__name__] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["lmforge", "gguf", "hf-llama"])
def test_loading_initialises_no_weight_and_draws_no_random_number(tmp_path, kind):
    model = llama()
    path = {"lmforge": lambda: save_pretrained(model, tmp_path / "m"), "gguf": lambda: write_gguf_model(
        model, tmp_path / "m.gguf"), "hf-llama": lambda: write_hf_llama(model, tmp_path / "hf")}[kind]()
    state = torch.get_rng_state()
    with CountInitialisers() as counter:
        loaded, _ = lmforge.load(path)
    assert counter.calls == Counter()  # before: normal_ / kaiming_uniform_ on every matrix
    assert torch.equal(torch.get_rng_state(), state)
    assert loaded.lm_head.proj.weight is loaded.tok_emb.weight  # still tied after the weights were assigned
    ids = torch.tensor([[5, 17, 42, 7, 99]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_assigned_weights_equal_a_copy_into_an_initialised_model(tmp_path):
    model = llama(tie=False)
    folder = save_pretrained(model, tmp_path / "m")
    loaded, _ = lmforge.load(folder)
    copied = Decoder(model.config).eval()  # the load as it was: initialise, then copy the file's tensors in
    load_weights(copied, read_weights(folder / WEIGHTS_NAME), "m")
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, copied(ids).logits)
    assert {n: p.dtype for n, p in loaded.named_parameters()} == {n: p.dtype for n, p in copied.named_parameters()}


def test_a_model_inside_unwritten_computes_its_buffers_and_leaves_initialisers_working_outside():
    with unwritten():
        model = llama()
    reference = llama()
    for (name, mine), (_, theirs) in zip(model.named_buffers(), reference.named_buffers(), strict=True):
        assert torch.equal(mine, theirs), name  # the rotary tables: computed, not skipped
    layer = torch.nn.Linear(4, 4)
    torch.nn.init.ones_(layer.weight)
    assert layer.weight.sum().item() == 16.0


def test_writing_into_a_loaded_model_leaves_its_file_alone(tmp_path):
    folder = save_pretrained(llama(), tmp_path / "m")
    before = hashlib.sha256((folder / WEIGHTS_NAME).read_bytes()).hexdigest()
    loaded, _ = lmforge.load(folder)
    with torch.no_grad():
        for p in loaded.parameters():
            p.add_(1.0)  # training writes into the parameters: the mapping is private (copy on write)
    assert hashlib.sha256((folder / WEIGHTS_NAME).read_bytes()).hexdigest() == before
    again, _ = lmforge.load(folder)
    assert torch.equal(again.tok_emb.weight + 1.0, loaded.tok_emb.weight)


# -- memory, measured in a fresh process -------------------------------------------------------------------------
MEASURE = """
import sys, torch, lmforge
import lmforge.interop.directories, lmforge.interop.gguf, lmforge.models.decoder  # noqa: imported before measuring
from lmforge.models import Decoder, get_preset

with torch.no_grad():  # the kernels' code and workspaces resident before measuring: a tiny model's forward
    Decoder(get_preset("gpt-tiny", vocab_size=64, n_layers=1, positions="rotary", norm="rmsnorm",
                       activation="swiglu", bias=False))(torch.tensor([[1, 2, 3]]))

def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size (Linux 4.0+)
except OSError:
    pass
before = kib("VmRSS")
model, _ = lmforge.load(sys.argv[1], tokenizer=False, dtype=sys.argv[2] if len(sys.argv) > 2 else None)
peak = kib("VmHWM") - before
with torch.no_grad():
    model(torch.tensor([[1, 2, 3]]))
print(peak * 1024, (kib("VmRSS") - before) * 1024)
"""


def measure(path: Path, dtype: str | None = None) -> tuple[int, int]:
    """(peak resident bytes during ``lmforge.load(path, dtype=dtype)``, resident bytes after a forward pass), both
    over the resident size before the load, in a fresh process."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(SRC), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", MEASURE, str(path), *([dtype] if dtype else [])],
                         capture_output=True, text=True, env=env,
                         timeout=300, check=True)
    peak, after = out.stdout.split()
    return int(peak), int(after)


def big_llama() -> Decoder:
    """~120 MB of float32 weights: the load's own allocations (config, code) are noise beside them."""
    return llama(vocab=8192, d=512, layers=6, d_ff=2048)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM / VmRSS from /proc (Linux)")
def test_a_safetensors_load_peaks_within_1_5x_its_file_and_stays_within_1_3x(tmp_path):
    folder = save_pretrained(big_llama(), tmp_path / "m")
    size = (folder / WEIGHTS_NAME).stat().st_size
    peak, after = measure(folder)
    assert peak <= 1.5 * size, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"  # before: 2.1x
    assert after <= 1.3 * size, f"{after / 2**20:.0f} MiB resident for a {size / 2**20:.0f} MiB file"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM / VmRSS from /proc (Linux)")
def test_a_gguf_load_peaks_within_1_5x_the_weights_it_makes(tmp_path):
    model = big_llama()
    path = write_gguf_model(model, tmp_path / "m.gguf")
    weights = sum(p.nelement() * p.element_size() for p in model.parameters())  # float32, as loaded
    peak, after = measure(path)
    assert peak <= 1.5 * weights, f"peak {peak / 2**20:.0f} MiB for {weights / 2**20:.0f} MiB of weights"  # was 4.0x
    assert after <= 1.3 * weights, f"{after / 2**20:.0f} MiB resident for {weights / 2**20:.0f} MiB of weights"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM / VmRSS from /proc (Linux)")
def test_an_int4_load_of_a_q4_1_file_peaks_within_1_5x_the_file_and_stays_within_1_3x(tmp_path):
    """``dtype="int4"`` of a Q4_1 GGUF (SmolLM2's width, 12 layers, 2,048 positions): the file's integers become the
    int4 layers, the heap each layer's repacking freed goes back at once, no float64 rotation table is made for a
    float32 model. SmolLM2's own file here: peak 1.30x, 1.13x after (1.84x before: its rotation tables in float64 too
    and the freed heap of 30 layers' temporaries)."""
    path = write_gguf_model(llama(vocab=8192, d=576, layers=12, d_ff=1536, positions=2048), tmp_path / "m.gguf",
                            "q4_1")
    size = path.stat().st_size
    peak, after = measure(path, "int4")
    assert peak <= 1.5 * size, f"peak {peak / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB file"
    assert after <= 1.3 * size, f"{after / 2**20:.0f} MiB resident for a {size / 2**20:.0f} MiB file"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM / VmRSS from /proc (Linux)")
def test_an_int8_load_of_a_q4_1_file_quantizes_as_it_reads_without_a_float_model(tmp_path):
    """``dtype="int8"`` of a 4-bit file: each matrix dequantized, quantized to int8 and let go before the next is
    read, so no float32 model ever exists: the peak stays well under the float32 weights (here 95-122 MiB for 185,
    a layer's temporaries freed once the layer is done; SmolLM2: 215 MiB, 1.4x the 150 MiB resident after, where
    the float32 model first made it 772 MiB)."""
    model = llama(vocab=8192, d=576, layers=12, d_ff=1536, positions=2048)
    path = write_gguf_model(model, tmp_path / "m.gguf", "q4_1")
    floats = sum(p.nelement() * p.element_size() for p in model.parameters())
    peak, _ = measure(path, "int8")
    assert peak <= 0.75 * floats, f"peak {peak / 2**20:.0f} MiB for {floats / 2**20:.0f} MiB of float32 weights"


def test_a_gguf_load_without_its_tokenizer_builds_none(tmp_path, monkeypatch):
    """``tokenizer=False`` skips the vocabulary's Python objects (~30 MiB for SmolLM2's 49,152 tokens and 48,900
    merges) but still checks that the file's tokens fit the embeddings."""
    import lmforge.interop.gguf as module

    path = write_gguf_model(llama(), tmp_path / "m.gguf")
    monkeypatch.setattr(module, "gguf_tokenizer", lambda model: pytest.fail("a tokenizer was built"))
    model, tok = lmforge.load(path, tokenizer=False)
    assert tok is None and model.config.vocab_size == 300


QUANTIZE = """
import torch
from lmforge.nn.quant import QuantizedLinear, quantize_int8

def kib(key):
    return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key + ":"))

QuantizedLinear.int8(*quantize_int8(torch.randn(64, 576)))  # the kernels' library and code loaded first
w = torch.randn(49152, 576)  # SmolLM2's tied head
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
except OSError:
    pass
before = kib("VmRSS")
QuantizedLinear.int8(*quantize_int8(w))
print((kib("VmHWM") - before) * 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM / VmRSS from /proc (Linux)")
def test_quantizing_a_vocabulary_head_peaks_within_its_float_weights_size():
    """Quantizing SmolLM2's 49152 x 576 head (113 MB in float32) works a block of rows at a time into outputs
    made once: the process grows by less than the float weight (the blocks' parts kept and joined grew it by
    ~300 MB: the peak of every int8 / int4 load from a GGUF file)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(SRC), os.environ.get("PYTHONPATH", "")])}
    peak = int(subprocess.run([sys.executable, "-c", QUANTIZE], capture_output=True, text=True, env=env,
                              timeout=300, check=True).stdout)
    assert peak <= 49152 * 576 * 4, f"peak {peak / 2**20:.0f} MiB"  # 64-85 MiB here, 312 before


def test_a_tied_q8_0_embedding_loads_as_the_int4_models_int8_head_without_a_float_matrix(tmp_path):
    """``--dtype int4`` of a GGUF file whose tied embedding is Q8_0: the head is an int8 layer of the file's own
    integers (d rounded to bfloat16: a weight moves by at most 2^-8 of itself), the embedding's lookups read its
    rows, and no float32 embedding is ever made; the logits follow those of the same file loaded as float32 and
    then quantized (whose head requantizes the dequantized embedding), to a small fraction of their spread."""
    pytest.importorskip("gguf", reason="the gguf package (lmforge[gguf], in the dev extra) writes GGUF files")
    from lmforge.interop.gguf import read_gguf
    from lmforge.interop.gguf_file import dequantize
    from lmforge.interop.gguf_write import write_gguf
    from lmforge.nn.quant import QuantizedEmbedding, QuantizedLinear, quantize

    model = llama(vocab=304)
    path = write_gguf(tmp_path / "m.gguf", llama_config_from_decoder(model.config),
                      llama_state_from_decoder(model.state_dict(), model.config), byte_tokenizer(304), None, "q8_0")
    ours, _ = lmforge.load(path, dtype="int4")
    assert isinstance(ours.tok_emb, QuantizedEmbedding) and ours.tok_emb.head is ours.lm_head.proj
    assert type(ours.lm_head.proj) is QuantizedLinear and ours.lm_head.proj.kind == "int8"
    file = read_gguf(path).file
    info = next(t for t in file.tensors if t.name == "token_embd.weight")
    stored = torch.from_numpy(dequantize(file.raw(info), info.kind, (304, 64)))  # d q in float32
    rows = ours.tok_emb(torch.arange(304))
    assert ((rows - stored).abs() <= 2 ** -8 * stored.abs()).all()
    reference, _ = lmforge.load(path)
    quantize(reference, "int4")
    with torch.no_grad():
        ids = torch.tensor([[1, 5, 9, 200, 3]])
        expected = reference(ids).logits
        # (the int4 layers round their activations to 8 bits a block: the embedding's 2^-8 moves show a little)
        torch.testing.assert_close(ours(ids).logits, expected, atol=0.03 * expected.std().item(), rtol=0)
