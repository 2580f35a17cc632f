"""The trainer never waits for the device between log steps, and computes what the plain loop computes.

On CPU there is no device to wait for, so "waiting" is counted where it would happen on a GPU: every
conversion of a tensor to a Python value (``item``, ``tolist``, ``float``, ``bool``, ...). The host builds
its batches from CPU tensors (``Prefetcher.build``, the source): conversions there read host memory and
are not counted; everything else the trainer does between two log steps must convert nothing.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from lmforge.models.config import get_preset
from lmforge.models.decoder import Decoder
from lmforge.train import TrainConfig, latest_checkpoint, train
from lmforge.train.batches import Prefetcher
from lmforge.train.metrics import count_targets, count_tokens
from lmforge.train.optim import build_optimizer, lr_at, no_decay_names, set_lr
from lmforge.train.trainer import Trainer, seed_everything
from test_train_loop import CLMSource

CONVERSIONS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__", "__format__")


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster (conftest.py)


def gpt(dropout: float = 0.1) -> Decoder:
    torch.manual_seed(0)
    return Decoder(get_preset("gpt-tiny", vocab_size=50, n_layers=2, dropout=dropout, attention_dropout=dropout))


def config(**kw) -> TrainConfig:
    base = dict(lr=3e-3, warmup_steps=2, max_steps=6, batch_size=2, grad_accum=2, save_every=0, log_every=3,
                progress=False, plot=False, tensorboard=False, device="cpu")
    return TrainConfig(**{**base, **kw})


def test_no_tensor_is_read_between_log_steps(tmp_path, monkeypatch):
    state = {"step": 0, "host": 0}
    reads: dict[int, list[str]] = {}

    def counting(name, original):
        def wrapper(self, *args, **kwargs):
            if not state["host"]:
                reads.setdefault(state["step"], []).append(name)
            return original(self, *args, **kwargs)
        return wrapper

    def tracked(original, key=None):
        def wrapper(self, *args, **kwargs):
            if key == "step":
                state["step"] = args[0]
            else:
                state["host"] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                if key != "step":
                    state["host"] -= 1
        return wrapper

    for name in CONVERSIONS:
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(Prefetcher, "build", tracked(Prefetcher.build))
    monkeypatch.setattr(Trainer, "train_step", tracked(Trainer.train_step, key="step"))
    train(gpt(), CLMSource(2, 50), config(max_steps=7, log_every=3), tmp_path)
    assert reads.get(3) and reads.get(6) and reads.get(7)  # the counting works: log steps read the loss
    quiet = {step: names for step, names in reads.items() if step not in (0, 3, 6, 7)}
    assert quiet == {}, f"the host read the device at steps {sorted(quiet)}: {quiet}"


def reference_run(model, source, cfg: TrainConfig) -> list[float]:
    """The loop as it was written before it went sync-free: every number read back at every step."""
    model.to("cpu")
    optimizer = build_optimizer(model, cfg, torch.device("cpu"), no_decay_names(model))
    seed_everything(cfg.seed)
    losses = []
    for step in range(1, cfg.max_steps + 1):
        set_lr(optimizer, lr_at(step, cfg))
        model.train()
        batches = [source.batch(step, m) for m in range(cfg.grad_accum)]
        n = torch.stack([count_targets(b, 1) for b in batches])
        weights = n.double() / n.sum().double()
        loss_sum = torch.zeros((), dtype=torch.float64)
        for i, batch in enumerate(batches):
            loss_i = model(**batch).loss
            (loss_i * weights[i].to(loss_i.dtype)).backward()
            loss_sum += loss_i.detach().double() * weights[i]
        loss = loss_sum.item()
        assert math.isfinite(loss) and sum(count_tokens(b) for b in batches) > 0
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip))
        assert math.isfinite(grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss)
    return losses


def test_bit_identical_to_the_plain_loop(tmp_path):
    """Dropout on, 2 uneven micro-batches, warmup and cosine: the same weights and losses to the last bit."""
    cfg = config(log_every=1)
    train(gpt(), CLMSource(2, 50), cfg, tmp_path)
    reference = gpt()
    losses = reference_run(reference, CLMSource(2, 50), cfg)
    saved = load_file(latest_checkpoint(tmp_path).path / "model.safetensors")
    expected = reference.state_dict()
    assert saved.keys() <= expected.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, expected[name]), name
    logged = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [e["loss"] for e in logged if e["event"] == "train"] == losses


def test_non_finite_between_log_steps_is_reported_at_the_next_one(tmp_path):
    """Step 5 goes NaN; steps 4 and 6 are checkpoints, 6 the first read after it: checkpoint 4 stays the last."""
    from lmforge.errors import LmforgeError
    from train_toy import ToyLM, ToySource

    torch.manual_seed(0)
    cfg = config(max_steps=9, log_every=3, save_every=2, lr=1e-2, grad_accum=1, batch_size=4)
    with pytest.raises(LmforgeError, match=r"non-finite loss at step 5 \(read at step 6\).*step-000004"):
        train(ToyLM(dropout=0.0), ToySource(4, poison_step=5), cfg, tmp_path)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 4 and all(torch.isfinite(t).all() for t in ckpt.weights().values())


def test_auto_precision_and_compile_are_fp32_eager_on_cpu():
    from lmforge.train.distributed import resolve_auto

    assert resolve_auto("auto", "auto", False, torch.device("cpu")) == ("fp32", False)
    assert resolve_auto("bf16", True, False, torch.device("cpu")) == ("bf16", True)
    assert TrainConfig().precision == "auto" and TrainConfig().compile == "auto"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a lent GPU machine)")
@pytest.mark.parametrize("compile", [False, True])
def test_on_cuda_a_step_between_log_steps_never_waits_for_the_device(tmp_path, compile):
    """The trainer's step on a GPU (bf16, fused AdamW, clipping, the non-finite watch, the next batch's prefetch),
    eager and compiled, under ``torch.cuda.set_sync_debug_mode("error")``: any host sync (a value read back, a copy
    from pageable memory, a blocking call) raises. The two steps before it warm up (kernels chosen, compiled)."""
    trainer = Trainer(gpt(dropout=0.0), CLMSource(4, 50, seq_len=32), config(device="cuda", compile=compile,
                                                                              max_steps=6), tmp_path)
    trainer.setup()
    for step in (1, 2):
        trainer.train_step(step)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for step in (3, 4):
            stats = trainer.train_step(step)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert math.isfinite(stats.loss.item()) and trainer.watch.first_bad() is None
