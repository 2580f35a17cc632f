"""Muon (train.optimizer: muon): the Newton-Schulz step, which parameters it takes, its AdamW half, and the
trainer's contracts with it: gradient accumulation, bit-identical resume, DDP on 2 CPU processes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.models import Decoder, get_preset
from lmforge.train import Callback, TrainConfig, Trainer, latest_checkpoint, train
from lmforge.train.optim import NS_COEFFICIENTS, Muon, build_optimizer, newton_schulz, set_lr
from train_toy import ToySource, toy_decoder

SCRIPT = Path(__file__).with_name("train_toy.py")


pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster (conftest.py)


def config(**kw) -> TrainConfig:
    base = dict(optimizer="muon", lr=1e-2, muon_lr=0.05, warmup_steps=1, max_steps=6, batch_size=4, save_every=0,
                log_every=1, progress=False, plot=False, tensorboard=False)
    return TrainConfig(**{**base, **kw})


def decoder(activation: str = "relu2", dtype=torch.float32) -> Decoder:
    torch.manual_seed(0)
    return Decoder(get_preset("gpt-tiny", vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=24,
                              max_positions=16, dropout=0.0, attention_dropout=0.0, norm="rmsnorm",
                              positions="rotary", qk_norm=True, activation=activation,
                              tie_embeddings=False)).to(dtype)


# -- Newton-Schulz ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(48, 96), (96, 48)])
def test_newton_schulz_returns_singular_values_near_one(shape):
    g = torch.randn(shape, dtype=torch.float64) * 1e-3  # the scale of a gradient does not matter
    g[:, 0] *= 50  # one dominant direction, as momentum often has
    s_in = torch.linalg.svdvals(g)
    assert s_in.max() / s_in.min() > 20
    o = newton_schulz(g)
    s_out = torch.linalg.svdvals(o)
    assert o.shape == g.shape and s_out.min() > 0.6 and s_out.max() < 1.25


def test_newton_schulz_keeps_singular_vectors_and_maps_each_singular_value():
    """NS(U S Vᵀ) = U p(S) Vᵀ with p the quintic iterated 5 times on S / ||S||_F: checked value by value."""
    u, _ = torch.linalg.qr(torch.randn(20, 20, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(30, 30, dtype=torch.float64))
    s = torch.linspace(0.2, 3.0, 20, dtype=torch.float64)
    g = u @ torch.diag(s) @ v[:, :20].T  # (20, 30)
    x = s / (s.norm() + 1e-7)
    a, b, c = NS_COEFFICIENTS
    for _ in range(5):
        x = a * x + b * x**3 + c * x**5
    torch.testing.assert_close(u.T @ newton_schulz(g) @ v[:, :20], torch.diag(x), atol=1e-10, rtol=0)


# -- what Muon takes, and its steps -------------------------------------------------------------------------------
@pytest.mark.parametrize("activation", ["relu2", "swiglu"])
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest(activation):
    model = decoder(activation)
    opt = build_optimizer(model, config(), torch.device("cpu"))
    assert isinstance(opt, Muon)
    names = {id(p): n for n, p in model.named_parameters()}
    muon = {names[id(p)]: g["splits"] for g in opt.param_groups if g["muon"] for p in g["params"]}
    adamw = {names[id(p)] for g in opt.param_groups if not g["muon"] for p in g["params"]}
    expected = {f"layers.{i}.{m}.weight" for i in range(2)
                for m in ("self_attn.in_proj", "self_attn.out_proj", "ffn.fc1", "ffn.fc2")}
    assert set(muon) == expected
    assert muon["layers.0.self_attn.in_proj.weight"] == (16, 16, 16)  # W_q, W_k, W_v apart
    assert muon["layers.0.ffn.fc1.weight"] == ((24, 24) if activation == "swiglu" else None)
    assert {"tok_emb.weight", "lm_head.proj.weight", "norm_f.weight", "layers.0.self_attn.q_norm.weight"} <= adamw
    assert len(adamw) + len(muon) == len(names)
    set_lr(opt, 1e-3)
    assert sorted({round(g["lr"], 12) for g in opt.param_groups}) == pytest.approx([1e-3, 1e-3 * 0.05 / 1e-2])


def test_a_muon_step_moves_every_direction_alike():
    """First step: the update of each block is -lr · NS(g) (up to the Nesterov factor), singular values ~ 1."""
    model = decoder()
    opt = build_optimizer(model, config(muon_lr=0.1), torch.device("cpu"))
    set_lr(opt, 1e-2)
    ids = torch.randint(0, 32, (4, 16))
    model(ids, labels=ids).loss.backward()
    w = model.layers[0].ffn.fc2.weight  # (16, 24): wide, scale factor 1
    before = w.detach().clone()
    opt.step()
    s = torch.linalg.svdvals((w.detach() - before) / -0.1)
    assert s.min() > 0.6 and s.max() < 1.25
    in_proj = model.layers[1].self_attn.in_proj.weight
    assert all(torch.linalg.matrix_rank(block.detach()) == 16 for block in in_proj.split(16))


def test_the_adamw_half_is_adamw():
    """Muon's AdamW groups follow torch.optim.AdamW step for step."""
    torch.manual_seed(0)
    a = nn.Sequential(nn.Embedding(10, 6), nn.LayerNorm(6))
    b = nn.Sequential(nn.Embedding(10, 6), nn.LayerNorm(6))
    b.load_state_dict(a.state_dict())
    ours = Muon([{"params": a.parameters(), "weight_decay": 0.1}], lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    torch_adamw = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(4):
        ids = torch.randint(0, 10, (3, 5), generator=torch.Generator().manual_seed(step))
        for model, opt in ((a, ours), (b, torch_adamw)):
            opt.zero_grad()
            model(ids).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_refusals():
    with pytest.raises(LmforgeError, match="fsdp"):
        build_optimizer(decoder(), config(fsdp=True), torch.device("cpu"))
    with pytest.raises(LmforgeError, match="no Transformer layers"):
        build_optimizer(nn.Linear(4, 4), config(), torch.device("cpu"))
    with pytest.raises(LmforgeError, match=r"train\.optimizer"):
        TrainConfig.from_dict({"optimizer": "sgd"})


# -- the trainer with Muon ----------------------------------------------------------------------------------------
def test_accumulated_muon_steps_equal_the_full_batch(tmp_path):
    full = Trainer(decoder(dtype=torch.float64), ToySource(4), config(), tmp_path / "full")
    accum = Trainer(decoder(dtype=torch.float64), ToySource(2), config(batch_size=2, grad_accum=2), tmp_path / "acc")
    full.setup()
    accum.setup()
    for step in (1, 2, 3):
        assert float(accum.train_step(step).loss) == pytest.approx(float(full.train_step(step).loss), abs=1e-6)
    for p, q in zip(full.model.parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(q, p, atol=1e-6, rtol=0)


def test_resume_with_muon_is_bit_identical(tmp_path):
    """The momentum buffers and AdamW moments are in the checkpoint: a resumed run ends where one run would."""
    cfg = config(max_steps=7, save_every=3)
    full = train(decoder(), ToySource(4), cfg, tmp_path / "full")

    class Crash(Callback):
        def on_step(self, trainer, step, record):
            if step == 5:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(decoder(), ToySource(4), cfg, tmp_path / "cut", callbacks=[Crash()])
    state = torch.load(latest_checkpoint(tmp_path / "cut").path / "optimizer.pt", weights_only=True)
    assert any("momentum_buffer" in s for s in state["optimizer"]["state"].values())
    resumed = train(decoder(), ToySource(4), cfg, tmp_path / "cut")
    assert resumed.resumed_from == 3 and resumed.loss == full.loss
    wa = load_file(latest_checkpoint(tmp_path / "full").path / "model.safetensors")
    wb = load_file(latest_checkpoint(tmp_path / "cut").path / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_ddp_with_muon_follows_one_process_with_the_doubled_batch(tmp_path):
    steps = 4
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LMFORGE_TEST_KILL_AT_STEP"):
        env.pop(key, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           "--out", str(tmp_path / "ddp"), "--batch-size", "2", "--steps", str(steps), "--grad-accum", "2",
           "--save-every", "0", "--eval-every", str(steps), "--optimizer", "muon"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    torch.manual_seed(0)
    single = TrainConfig(lr=1e-2, warmup_steps=2, max_steps=steps, batch_size=4, grad_accum=2, save_every=0,
                         eval_every=steps, log_every=1, progress=False, plot=False, optimizer="muon")
    train(toy_decoder(), ToySource(4), single, tmp_path / "single")
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr[-3000:]

    def curve(run: Path) -> list[tuple[str, int, float]]:
        events = map(json.loads, (run / "log.jsonl").read_text().splitlines())
        return [(e["event"], e["step"], e.get("loss", e.get("eval_loss"))) for e in events]

    one, two = curve(tmp_path / "single"), curve(tmp_path / "ddp")
    assert [(e, s) for e, s, _ in two] == [(e, s) for e, s, _ in one]
    assert [v for *_, v in two] == pytest.approx([v for *_, v in one], abs=1e-5)
