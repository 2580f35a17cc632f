"""The training loop in-process: exact gradient accumulation, NaN stop, logs, resume, refusals."""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from conftest import assert_picture
from lmforge.errors import LmforgeError
from lmforge.train import Callback, TrainConfig, Trainer, count_targets, latest_checkpoint, train
from train_toy import ToyLM, ToySource

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one thread is faster (conftest.py)


def config(**kw) -> TrainConfig:
    base = dict(lr=1e-2, warmup_steps=1, max_steps=6, batch_size=4, save_every=0, log_every=1,
                progress=False, plot=False, tensorboard=False)
    return TrainConfig(**{**base, **kw})


def toy(dropout: float = 0.0, dtype=torch.float32, d: int = 16) -> ToyLM:
    torch.manual_seed(0)
    return ToyLM(d=d, dropout=dropout).to(dtype)


def weights(run_dir) -> dict[str, torch.Tensor]:
    return load_file(latest_checkpoint(run_dir).path / "model.safetensors")


def events(run_dir, kind: str) -> list[dict]:
    lines = (run_dir / "log.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


# ---------------------------------------------------------------------------------------------- accumulation

def test_accumulated_gradients_equal_the_full_batch_float64(tmp_path):
    """k=3 micro-batches of b=2 rows give the gradient of one batch of 6 rows, with uneven padding."""
    full = Trainer(toy(dtype=torch.float64), ToySource(6), config(batch_size=6), tmp_path / "full")
    accum = Trainer(toy(dtype=torch.float64), ToySource(2), config(batch_size=2, grad_accum=3), tmp_path / "acc")
    full.setup()
    accum.setup()
    loss_full, loss_accum = float(full.forward_backward(1)), float(accum.forward_backward(1))
    assert loss_accum == pytest.approx(loss_full, abs=1e-12)
    for (name, p), q in zip(full.model.named_parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-12, msg=name)

    # the micro-batches hold different numbers of targets, so a plain mean of their means is wrong
    src = ToySource(2)
    counts = [int(count_targets(src.batch(1, m))) for m in range(3)]
    assert len(set(counts)) > 1
    model = toy(dtype=torch.float64)
    with torch.no_grad():
        naive = sum(float(model(**src.batch(1, m)).loss) for m in range(3)) / 3
    assert abs(naive - loss_full) > 1e-6


def test_a_micro_batch_without_targets_adds_nothing(tmp_path):
    class Hole(ToySource):  # rows 2 and 3 (micro-batch 1 of 3 x 2 rows) have no targets at all
        def _row(self, step, g):
            ids, labels = super()._row(step, g)
            return ids, labels.fill_(-100) if g in (2, 3) else labels

    full = Trainer(toy(dtype=torch.float64), Hole(6), config(batch_size=6), tmp_path / "full")
    accum = Trainer(toy(dtype=torch.float64), Hole(2), config(batch_size=2, grad_accum=3), tmp_path / "acc")
    full.setup()
    accum.setup()
    loss = float(accum.forward_backward(1))  # a tensor on the device: the trainer reads it at log steps only
    assert math.isfinite(loss) and loss == pytest.approx(float(full.forward_backward(1)), abs=1e-12)
    for p, q in zip(full.model.parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-12)


def test_accumulated_training_matches_full_batch_float32(tmp_path):
    a = train(toy(), ToySource(8), config(batch_size=8), tmp_path / "a")
    b = train(toy(), ToySource(2), config(batch_size=2, grad_accum=4), tmp_path / "b")
    assert b.loss == pytest.approx(a.loss, abs=1e-5)
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-5)


def test_count_targets_rows_without_token_labels():
    assert int(count_targets({"input_ids": torch.zeros(3, 5), "next_sentence_label": torch.tensor([0, 1, 1])})) == 3


# ---------------------------------------------------------------------------------------------- NaN

def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    with pytest.raises(LmforgeError, match=r"non-finite loss at step 5 .*step-000004"):
        train(toy(), ToySource(4, poison_step=5), config(max_steps=8, save_every=2), tmp_path)
    ckpt = latest_checkpoint(tmp_path)
    assert ckpt.step == 4
    assert all(torch.isfinite(t).all() for t in ckpt.weights().values())
    assert ckpt.optimizer()["optimizer"]["state"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-000002", "step-000004"]


# ---------------------------------------------------------------------------------------------- logs

def test_logs_eval_metrics_and_plot(tmp_path):
    result = train(toy(), ToySource(4), config(max_steps=6, eval_every=3, log_every=2, plot=True), tmp_path)
    assert [e["step"] for e in events(tmp_path, "train")] == [2, 4, 6]
    evals = events(tmp_path, "eval")
    assert [e["step"] for e in evals] == [3, 6]
    last = evals[-1]
    assert last["eval_ppl"] == pytest.approx(math.exp(last["eval_loss"]))
    # the reference: the trained weights scored by hand on the same validation batches (token-weighted)
    model = toy()
    model.load_state_dict(weights(tmp_path), strict=False)
    model.eval()
    hits = total = 0
    losses = []
    with torch.no_grad():
        for batch in ToySource(4).eval_batches():
            out = model(batch["input_ids"], batch["labels"])
            mask = batch["labels"] != -100
            hits += int((out.logits.argmax(-1)[mask] == batch["labels"][mask]).sum())
            total += int(mask.sum())
            losses.append((float(out.loss), int(mask.sum())))
    assert last["eval_accuracy"] == pytest.approx(hits / total, abs=1e-6)
    assert last["eval_loss"] == pytest.approx(sum(v * n for v, n in losses) / total, rel=1e-5)
    assert result.eval == {k: v for k, v in last.items() if k.startswith("eval_")}
    assert result.best_eval_loss == min(e["eval_loss"] for e in evals)
    train_event = events(tmp_path, "train")[-1]
    assert {"loss", "lr", "grad_norm", "tokens", "tokens_per_s"} <= set(train_event)
    assert train_event["tokens"] == result.tokens == 6 * 4 * 12
    assert_picture(tmp_path / "loss.png")
    assert "max_steps: 6" in (tmp_path / "config.yaml").read_text()


def test_callbacks_are_called(tmp_path):
    calls = []

    class Spy(Callback):
        def on_step(self, trainer, step, record):
            calls.append(("step", step))

        def on_eval(self, trainer, step, metrics):
            calls.append(("eval", step))

        def on_save(self, trainer, step, path):
            calls.append(("save", step, path.name))

    train(toy(), ToySource(4), config(max_steps=2, log_every=1), tmp_path, callbacks=[Spy()])
    assert calls == [("step", 1), ("step", 2), ("eval", 2), ("save", 2, "step-000002")]


# ---------------------------------------------------------------------------------------------- resume

def test_crash_and_resume_in_process_is_bit_identical(tmp_path):
    """With dropout on: the restored RNG gives the same masks. (The SIGKILL test is in test_train_resume.)"""
    cfg = config(max_steps=7, save_every=3)
    full = train(toy(dropout=0.2), ToySource(4), cfg, tmp_path / "full")

    class Crash(Callback):
        def on_step(self, trainer, step, record):
            if step == 5:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(toy(dropout=0.2), ToySource(4), cfg, tmp_path / "cut", callbacks=[Crash()])
    resumed = train(toy(dropout=0.2), ToySource(4), cfg, tmp_path / "cut")
    assert resumed.resumed_from == 3 and resumed.loss == full.loss
    wa, wb = weights(tmp_path / "full"), weights(tmp_path / "cut")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    def curve(run):  # the log without timings
        return [{k: v for k, v in e.items() if k not in ("tokens_per_s", "elapsed_s")} for e in events(run, "train")]

    assert curve(tmp_path / "cut") == curve(tmp_path / "full")


def test_resume_extends_a_finished_run(tmp_path):
    first = train(toy(), ToySource(4), config(max_steps=4, save_every=2), tmp_path)
    again = train(toy(), ToySource(4), config(max_steps=4, save_every=2), tmp_path)
    assert again.resumed_from == 4 and again.step == 4 and again.loss == first.loss
    more = train(toy(), ToySource(4), config(max_steps=6, save_every=2), tmp_path)
    assert more.resumed_from == 4 and more.step == 6
    assert [e["step"] for e in events(tmp_path, "train")] == [1, 2, 3, 4, 5, 6]


def test_a_run_of_another_model_is_refused(tmp_path):
    recipe = {"model": {"d": 16}, "train": config(max_steps=2).to_dict()}
    train(toy(), ToySource(4), config(max_steps=2), tmp_path / "r", recipe=recipe)
    with pytest.raises(LmforgeError, match=r"model\.d is 16 in this run but 8 now"):
        train(toy(d=8), ToySource(4), config(max_steps=2), tmp_path / "r", recipe={**recipe, "model": {"d": 8}})
    train(toy(), ToySource(4), config(max_steps=2), tmp_path / "s")  # no recipe: the shapes are checked
    with pytest.raises(LmforgeError, match="shape"):
        train(toy(d=8), ToySource(4), config(max_steps=2), tmp_path / "s")


def test_leftovers_of_an_interrupted_save_are_ignored(tmp_path):
    train(toy(), ToySource(4), config(max_steps=5, save_every=1, keep_last=2), tmp_path)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000004", "step-000005"]
    (root / ".tmp-step-000006-123").mkdir()  # killed while writing
    (root / ".tmp-step-000006-123" / "model.safetensors").write_bytes(b"partial")
    (root / "latest").write_text("step-000009\n")  # names a checkpoint that is not there
    ckpt = latest_checkpoint(tmp_path, clean=True)
    assert ckpt.step == 5 and not (root / ".tmp-step-000006-123").exists()


# ---------------------------------------------------------------------------------------------- precision

@pytest.mark.parametrize("precision, tolerance", [("bf16", 0.02), ("fp16", 0.005)])
def test_mixed_precision_tracks_fp32(tmp_path, precision, tolerance):
    """Autocast changes the rounding, not the training: after 6 steps the loss is within ``tolerance``
    (relative) of the fp32 run's (bf16 keeps 8 bits of mantissa, fp16 11), and it fell as much."""
    reference = train(toy(), ToySource(4), config(), tmp_path / "fp32")
    mixed = train(toy(), ToySource(4), config(precision=precision), tmp_path / precision)
    assert mixed.loss == pytest.approx(reference.loss, rel=tolerance)
    assert mixed.loss != reference.loss  # autocast really ran in the lower precision
    first = events(tmp_path / precision, "train")[0]["loss"]
    assert first == pytest.approx(events(tmp_path / "fp32", "train")[0]["loss"], rel=tolerance)


# ---------------------------------------------------------------------------------------------- the GPT

class CLMSource:
    """Causal-LM batches for lmforge's Decoder: labels = input ids, a random tail padded with -100."""

    def __init__(self, batch_size: int, vocab: int, seq_len: int = 10):
        self.batch_size, self.vocab, self.seq_len = batch_size, vocab, seq_len

    def batch(self, step, micro, rank=0, world_size=1):
        rows = []
        first = micro * world_size * self.batch_size + rank * self.batch_size
        for g in range(first, first + self.batch_size):
            gen = torch.Generator().manual_seed(step * 1000 + g)
            ids = torch.randint(0, self.vocab, (self.seq_len,), generator=gen)
            labels = ids.clone()
            pad = int(torch.randint(0, self.seq_len - 2, (1,), generator=gen))
            if pad:
                labels[-pad:] = -100
            rows.append((ids, labels))
        return {"input_ids": torch.stack([r[0] for r in rows]), "labels": torch.stack([r[1] for r in rows])}

    def eval_batches(self):
        return [self.batch(-1, 0)]


def test_decoder_accumulation_and_eval(tmp_path):
    decoder = pytest.importorskip("lmforge.models.decoder")
    from lmforge.models.config import get_preset

    def gpt():
        torch.manual_seed(0)
        cfg = get_preset("gpt-tiny", vocab_size=50, n_layers=1, dropout=0.0, attention_dropout=0.0)
        return decoder.Decoder(cfg).double()

    full = Trainer(gpt(), CLMSource(4, 50), config(batch_size=4), tmp_path / "full")
    accum = Trainer(gpt(), CLMSource(2, 50), config(batch_size=2, grad_accum=2), tmp_path / "acc")
    full.setup()
    accum.setup()
    assert full.shift == 1  # next-token loss: targets are labels[:, 1:]
    # the Decoder computes its cross-entropy in float32, hence float32 tolerances
    assert float(accum.forward_backward(1)) == pytest.approx(float(full.forward_backward(1)), abs=1e-6)
    for p, q in zip(full.model.parameters(), accum.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=1e-6)
    result = train(gpt().float(), CLMSource(2, 50), config(max_steps=2), tmp_path / "run")
    assert {"eval_loss", "eval_ppl", "eval_accuracy"} <= set(result.eval)
    assert "model:\n  class: Decoder" in (tmp_path / "run" / "config.yaml").read_text()


def test_eval_metrics_from_logits_nsp_and_model_metrics():
    from types import SimpleNamespace

    from lmforge.train.metrics import EvalAccumulator

    acc = EvalAccumulator()
    batch = {"labels": torch.tensor([0, 1, 1, -100]), "next_sentence_label": torch.tensor([1, 1, 0, 0])}
    out = SimpleNamespace(loss=torch.tensor(0.5), logits=torch.tensor([[1.0, 0], [0, 1], [1, 0], [0, 1]]),
                          next_sentence_logits=torch.tensor([[0.0, 1], [1, 0], [1, 0], [1, 0]]),
                          metrics={"f1": 0.25})
    acc.update(batch, out)
    result = acc.result()
    assert result["eval_accuracy"] == pytest.approx(2 / 3)  # row 4 is ignored (-100)
    assert result["eval_nsp_accuracy"] == 0.75 and result["eval_f1"] == 0.25
    assert result["eval_ppl"] == pytest.approx(math.exp(0.5))


def test_tf32_is_on_while_training_on_cuda_only_and_restored_after():
    """TF32 is the trainer's choice for its own matmuls, not a process-wide switch left behind (the flags can be
    set without a GPU, so this runs anywhere)."""
    from lmforge.train.trainer import tf32

    def flags() -> tuple[bool, bool]:
        return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32

    before = flags()
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        with tf32(torch.device("cuda")):
            assert flags() == (True, True)
        assert flags() == (False, False)
        with tf32(torch.device("cpu")):
            assert flags() == (False, False)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
