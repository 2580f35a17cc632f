"""The training loop: one update per step, resumable at any step, on 1 or N processes.

    for step in start+1 .. max_steps:
        lr = schedule(step)
        N = targets in all micro-batches of all processes            (one all-reduce)
        for micro-batch i (batch i of this step from the source):
            loss_i = model(**batch_i).loss                            mean over its n_i targets
            backward(loss_i · n_i · W / N)                            DDP averages over the W processes
        clip the gradient norm; AdamW step; zero the gradients
        log / evaluate / checkpoint every log_every / eval_every / save_every steps; there, stop if a
        loss or gradient norm was NaN or infinite (the last checkpoint stays the last good one)
        on SIGINT / SIGTERM: checkpoint this step and stop (train/signals.py)

No step waits for the device. Loss, token count, gradient norm and the non-finite check stay on it and
are read only at log, eval and save steps; step s + 1's batches are built and copied while step s runs
(train/batches.py). So on a GPU the host queues work ahead and the device never idles between steps.

The data position of a run is its step: the source returns the same batch for the same
(step, micro, rank, world_size), so a checkpoint needs no loader state and a resumed run sees the
batches the uninterrupted run would have seen. With the RNG states restored too, a resumed run on CPU
ends bit-identical to one that was never stopped, given the same thread count and device (floating-point
sums depend on how the work is split: a checkpoint records both and resume warns when they differ).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm import tqdm

from lmforge.errors import LmforgeError
from lmforge.lock import RunLock
from lmforge.models.registry import load_weights, tied_aliases
from lmforge.schema import Recipe
from lmforge.train import distributed as D
from lmforge.train.attention_kernel import fastest_attention
from lmforge.train.batches import BatchSource, Prefetcher
from lmforge.train.checkpoint import (
    Checkpoint,
    capture_rng,
    checkpoint_config,
    checkpoints_dir,
    hardware,
    save_checkpoint,
    seed_everything,
    step_name,
)
from lmforge.train.config import TrainConfig, default_recipe, save_recipe
from lmforge.train.logs import RunLog, info
from lmforge.train.metrics import EvalAccumulator, NonFiniteWatch, label_shift
from lmforge.train.optim import build_optimizer, lr_at, no_decay_names, set_lr
from lmforge.train.results import StepStats, TrainResult
from lmforge.train.resume import last_good, prepare_run, restore_state
from lmforge.train.signals import GracefulStop


@contextmanager
def tf32(device: torch.device) -> Iterator[None]:
    """On CUDA, TF32 tensor cores for fp32 matmuls (10 mantissa bits, as bf16 has 7) while training only: the
    process's own settings are restored after ``fit``."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


class Callback:
    """Hooks called on rank 0 (on_step_end: on every process); override the ones you need."""

    def on_step(self, trainer: Trainer, step: int, record: dict[str, Any]) -> None: ...

    def on_eval(self, trainer: Trainer, step: int, metrics: dict[str, float]) -> None: ...

    def on_save(self, trainer: Trainer, step: int, path: Path) -> None: ...

    def on_step_end(self, trainer: Trainer, step: int) -> None:
        """Called on every process (not rank 0 alone) once the step, and its checkpoint if any, is done."""


class Trainer:
    """Train ``model`` on ``source`` into ``run_dir``, resuming from its latest checkpoint if there is one.

    model: any nn.Module whose ``forward(**batch)`` returns an object with a scalar ``.loss``.
    recipe: the resolved recipe to save as ``config.yaml``; by default the ``train`` section and the model's
        ``config`` dataclass when it has one. ``schema``: the workflow's ``lmforge.schema.Recipe``, whose resume
        policy says which sections a resumed run must keep (without it, only ``train:`` may change).
    tokenizer_dir, model_info: where the run's tokenizer is and more config.json fields (a classifier's
        labels); each checkpoint's config.json holds them, so that a checkpoint is a model directory.
    forward_options: more keyword arguments of the model's forward on training steps, e.g. ``{"loss_only": True}``
        for a decoder whose labels cover a few positions; ``eval_options``: the same at evaluation (where
        ``eval_accuracy`` then needs the logits the model still returns; metrics.py).
    """

    def __init__(
        self,
        model: nn.Module,
        source: BatchSource,
        config: TrainConfig,
        run_dir: str | Path,
        callbacks: Sequence[Callback] | None = None,
        recipe: dict[str, Any] | None = None,
        tokenizer_dir: str | Path | None = None,
        model_info: dict[str, Any] | None = None,
        schema: Recipe | None = None,
        forward_options: dict[str, Any] | None = None,
        eval_options: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.source, self.config = model, source, config
        self.forward_options, self.eval_options = dict(forward_options or {}), dict(eval_options or {})
        self.tokenizer_dir, self.model_info = tokenizer_dir, model_info
        self.run_dir = Path(run_dir)
        self.callbacks = list(callbacks or [])
        self.stop_early = False  # a callback sets it to end the run after the current step
        self.recipe = recipe if recipe is not None else default_recipe(model, config)
        self.schema = schema
        self.env = D.detect()
        self.device = D.pick_device(config.device, self.env)
        self.shift = label_shift(model)
        self.precision, self.compile = D.resolve_auto(config.precision, config.compile, config.fsdp, self.device)
        self.step = 0
        self.tokens = 0  # input tokens of all processes, up to the last log / eval / save step
        self.unread_tokens = torch.zeros((), dtype=torch.float64, device=self.device)  # since then, on device
        self.watch = NonFiniteWatch(self.device)
        self.batches = Prefetcher(source, config.grad_accum, self.env.rank, self.env.world_size, self.device,
                                  self.shift)
        self.best_eval_loss: float | None = None
        self.best_step: int | None = None
        self._recipe_pending = False  # config.yaml is rewritten with a changed recipe at its first checkpoint

    # ------------------------------------------------------------------------------------------ setup

    def _autocast(self):
        p = self.precision
        if p == "fp32":
            return nullcontext()
        dtype = torch.bfloat16 if p == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _attention_kernel(self):
        """On CUDA in bf16 / fp16, torch's attention kernels in the order measured for this model at the run's
        micro-batch and context (train/attention_kernel.py); elsewhere nothing changes."""
        if self.precision == "fp32" or self.device.type != "cuda":
            return nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16" else torch.float16
        seq = getattr(getattr(self.model, "config", None), "max_positions", 512)
        return fastest_attention(self.model, self.config.batch_size, seq, dtype, self.device,
                                 say=info if self.env.is_main else lambda _: None)

    # ------------------------------------------------------------------------------------------ loop

    def fit(self) -> TrainResult:
        created = D.init(self.env, self.device, self.config.dist_timeout)
        try:
            with RunLock(self.run_dir) if self.env.is_main else nullcontext(), tf32(self.device), \
                    self._attention_kernel():
                return self._fit()
        except RuntimeError as err:  # a collective failed: another process died or stopped answering?
            D.raise_peer_failure(err, self.env, self.config.dist_timeout, lambda: last_good(self.run_dir))
            raise
        finally:
            D.shutdown(created)

    def setup(self) -> Checkpoint | None:
        """Load the latest checkpoint (if any), wrap the model (DDP / FSDP / compile), build AdamW.

        Returns the checkpoint resumed from. ``fit`` calls it; call it yourself only to drive
        ``forward_backward`` / ``train_step`` by hand (as the tests do).
        """
        cfg, env = self.config, self.env
        ckpt, self._recipe_pending = prepare_run(self.run_dir, env, self.recipe, self.schema)
        if ckpt is not None:
            load_weights(self.model, ckpt.weights(), str(ckpt.path / "model.safetensors"))  # models/registry.py
        self.model.to(self.device)
        no_decay = no_decay_names(self.model)  # before FSDP flattens the parameters
        self.aliases = set(tied_aliases(self.model.state_dict()))  # tied weights, saved once
        self.wrapped = D.wrap(self.model, env, self.device, fsdp=cfg.fsdp, use_ddp=cfg.ddp)
        self.forward_model = torch.compile(self.wrapped) if self.compile else self.wrapped
        self.optimizer = build_optimizer(self.wrapped, cfg, self.device, no_decay)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision == "fp16")
        if ckpt is None:
            seed_everything(cfg.seed + env.rank)  # dropout masks differ per process, repeat per run
            self.step = 0
        else:
            self.tokens, self.best_eval_loss, self.best_step = restore_state(
                ckpt, self.wrapped, self.optimizer, self.scaler, env, self.device, cfg.seed)
            self.step = ckpt.step
            if env.is_main:
                info(f"resuming {self.run_dir} from step {self.step} ({ckpt.path.name})")
        return ckpt

    def _fit(self) -> TrainResult:
        cfg, env = self.config, self.env
        ckpt = self.setup()
        start = self.step
        log = RunLog(self.run_dir, start if ckpt else None, cfg.tensorboard, enabled=env.is_main)
        bar = tqdm(total=cfg.max_steps, initial=start, unit="step", dynamic_ncols=True,
                   disable=not (env.is_main and cfg.progress))  # tqdm writes to stderr
        last_ckpt: Path | None = ckpt.path if ckpt else None
        loss = float("nan")
        metrics: dict[str, float] = {}
        t_log, tokens_log = time.perf_counter(), self.tokens
        t_start = t_log  # elapsed_s in the log: seconds since this process started training (loss vs time)
        if start >= cfg.max_steps and env.is_main:
            info(f"{self.run_dir} already finished at step {start}; raise train.max_steps to train further")
            done = [e for e in log.events if e.get("event") == "train"]
            loss = float(done[-1]["loss"]) if done else loss
            evals = [e for e in log.events if e.get("event") == "eval"]  # the last evaluation's metrics, as logged
            metrics = {k: float(v) for k, v in (evals[-1] if evals else {}).items() if k.startswith("eval_")}
        stop = GracefulStop(env, self.device)
        stop.install()
        try:
            for step in range(start + 1, cfg.max_steps + 1):
                self.step = step
                stats = self.train_step(step)
                last = step == cfg.max_steps
                bar.update(1)
                log_now = bool(cfg.log_every and step % cfg.log_every == 0) or last
                eval_now = bool(cfg.eval_every and step % cfg.eval_every == 0) or last
                save_now = bool(cfg.save_every and step % cfg.save_every == 0) or last
                if log_now or eval_now or save_now:
                    self.check_finite(step)  # the host waits for the device here, and only here
                if log_now:
                    loss, grad_norm = torch.stack([stats.loss, stats.grad_norm.double()]).tolist()
                    self.read_tokens()
                    now = time.perf_counter()
                    tok_s = (self.tokens - tokens_log) / max(now - t_log, 1e-9)
                    t_log, tokens_log = now, self.tokens
                    record = log.write("train", step, loss=loss, lr=stats.lr, grad_norm=grad_norm,
                                       tokens=self.tokens, tokens_per_s=round(tok_s, 1),
                                       elapsed_s=round(now - t_start, 2))
                    bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tok_s:,.0f}", refresh=False)
                    for cb in self.callbacks if env.is_main else []:
                        cb.on_step(self, step, record)
                if eval_now:
                    metrics = self.evaluate() or metrics
                    if metrics:
                        self._note_best(step, metrics)
                        log.write("eval", step, **metrics, elapsed_s=round(time.perf_counter() - t_start, 2))
                        if env.is_main and cfg.plot:
                            log.plot(self.run_dir / "loss.png")
                        for cb in self.callbacks if env.is_main else []:
                            cb.on_eval(self, step, metrics)
                stop_now = self.stop_early and not last  # a callback asked (early stopping)
                saved = save_now or stop_now
                if saved:
                    last_ckpt = self.save()
                for cb in self.callbacks:
                    cb.on_step_end(self, step)
                if stop_now:
                    info(f"stopping early at step {step} (a callback asked); checkpoint {last_ckpt}")
                    break
                # one process: a flag read, every step; several: an all-reduce, so only where the host waits anyway
                check = not env.enabled or log_now or eval_now or save_now
                if not last and check and (signum := stop.requested()):
                    if not saved:
                        self.save()
                    raise stop.stopped(signum, step, checkpoints_dir(self.run_dir) / step_name(step))
            if env.is_main and cfg.plot:
                log.plot(self.run_dir / "loss.png")
        finally:
            stop.uninstall()
            bar.close()
            log.close()
        return TrainResult(step=self.step, loss=loss, tokens=self.tokens, eval=metrics,
                           best_eval_loss=self.best_eval_loss, checkpoint=last_ckpt,
                           resumed_from=ckpt.step if ckpt else None)

    def train_step(self, step: int) -> StepStats:
        """One optimizer update from ``grad_accum`` micro-batches; nothing in it waits for the device."""
        cfg = self.config
        lr = lr_at(step, cfg)
        set_lr(self.optimizer, lr)
        loss = self.forward_backward(step)
        self.scaler.unscale_(self.optimizer)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
        if D.is_fsdp(self.wrapped):
            grad_norm = self.wrapped.clip_grad_norm_(max_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.wrapped.parameters(), max_norm)
        fp16 = self.scaler.is_enabled()  # fp16: the scaler skips overflowing steps itself
        self.watch.update(step, loss, grad_norm, check_grad=not fp16)
        with nullcontext() if fp16 else self.watch.guard(self.optimizer):  # no update once a value went bad
            self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        return StepStats(loss=loss, grad_norm=grad_norm, lr=lr)

    def forward_backward(self, step: int) -> torch.Tensor:
        """Accumulate the gradient of step ``step``'s whole batch (all micro-batches, all processes).

        Returns the batch's loss, a () float64 tensor on the device: the mean over all its targets,
        identical on every process. Queues step + 1's batches before returning.
        """
        cfg, env = self.config, self.env
        self.forward_model.train()
        batches = self.batches.get(step)
        if env.world_size == 1 and all(batches.empty):  # counted on the host: no need to ask the device
            raise LmforgeError(f"step {step} has no loss targets (every label is -100)")
        total = D.all_reduce_sum(batches.targets.sum(), env)  # N: targets in the whole update, all processes
        weights = batches.targets * env.world_size / total  # n_i · W / N: DDP divides the summed gradients by W
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for i, batch in enumerate(batches.micro):
            with D.no_sync(self.wrapped, skip=i < cfg.grad_accum - 1), self._autocast():
                out = self.forward_model(**batch, **self.forward_options)
                if getattr(out, "loss", None) is None:
                    raise LmforgeError("the model returned no loss: does the batch carry labels?")
                loss_i = out.loss  # () mean over this micro-batch's targets
                if batches.empty[i] and getattr(out, "logits", None) is not None:
                    loss_i = out.logits.sum() * 0.0  # no targets: the mean is 0/0; contribute 0 instead
                self.scaler.scale(loss_i * weights[i].to(loss_i.dtype)).backward()
            loss_sum += loss_i.detach().double() * weights[i] / env.world_size
        if step < cfg.max_steps:
            self.batches.prefetch(step + 1)  # built on the host while the device runs this step
        loss, tokens = D.all_reduce_sum(torch.stack([loss_sum, batches.tokens]), env)
        self.unread_tokens += tokens
        return loss

    def read_tokens(self) -> int:
        """Fold the tokens counted on the device since the last read into ``self.tokens`` (waits for it)."""
        self.tokens += int(self.unread_tokens.item())
        self.unread_tokens.zero_()
        return self.tokens

    def check_finite(self, step: int) -> None:
        """Stop if a loss or gradient norm went NaN or infinite since the start (reads the device)."""
        bad = self.watch.first_bad()
        if bad is None:
            return
        kind, at = bad
        self.optimizer.zero_grad(set_to_none=True)
        raise LmforgeError(
            f"non-finite {kind} at step {at} (read at step {step}); training stopped, the last good checkpoint is "
            f"{last_good(self.run_dir)} (lower train.lr, set train.grad_clip, or use train.precision=bf16)"
        )

    # ------------------------------------------------------------------------------------------ eval

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Loss, perplexity and accuracies over the source's validation batches ({} if there are none).

        Under DDP each process takes every W-th batch and the sums are combined; under FSDP every
        process runs every batch (each forward needs all of them).
        """
        cfg, env = self.config, self.env
        fsdp = D.is_fsdp(self.wrapped)
        model = self.wrapped if fsdp else D.unwrap(self.wrapped)
        model.eval()
        acc = EvalAccumulator(self.shift)
        eval_batches = getattr(self.source, "eval_batches", None)
        for i, batch in enumerate(eval_batches() if eval_batches else []):
            if cfg.eval_batches and i >= cfg.eval_batches:
                break
            if not fsdp and i % env.world_size != env.rank:
                continue
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with self._autocast():
                acc.update(batch, model(**batch, **self.eval_options))
        if not fsdp:
            acc.merge(D.gather_objects(acc.sums, env))  # type: ignore[arg-type]
        model.train()
        return acc.result()

    def _note_best(self, step: int, metrics: dict[str, float]) -> None:
        loss = metrics.get("eval_loss")
        if loss is not None and (self.best_eval_loss is None or loss < self.best_eval_loss):
            self.best_eval_loss, self.best_step = loss, step

    # ------------------------------------------------------------------------------------------ checkpoints

    def save(self) -> Path | None:
        """Checkpoint the current step (collective: every process calls it; rank 0 writes)."""
        self.read_tokens()
        weights = {k: v for k, v in D.full_state_dict(self.wrapped, self.env).items() if k not in self.aliases}
        optim = D.full_optimizer_state(self.wrapped, self.optimizer)
        rngs = D.gather_objects(capture_rng(), self.env)
        path = None
        if self.env.is_main:
            bad = next((k for k, t in weights.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
            if bad is not None:  # never let a broken state become the "last good" checkpoint
                raise LmforgeError(f"non-finite weights ({bad}) at step {self.step}; not saving, training stopped; "
                                   f"the last good checkpoint is {last_good(self.run_dir)}")
            state = {
                "tokens": self.tokens,
                "best_eval_loss": self.best_eval_loss,
                "best_step": self.best_step,
                "world_size": self.env.world_size,
                **hardware(self.device),
                "rng": rngs,
            }
            path = save_checkpoint(self.run_dir, self.step, weights,
                                   {"optimizer": optim, "scaler": self.scaler.state_dict()}, state,
                                   keep_last=self.config.keep_last,
                                   model_config=checkpoint_config(self.model, self.tokenizer_dir, self.model_info))
            if self._recipe_pending:  # the changed settings now have a checkpoint: the record follows
                save_recipe(self.recipe, self.run_dir / "config.yaml")
                self._recipe_pending = False
            for cb in self.callbacks:
                cb.on_save(self, self.step, path)
        D.barrier(self.env)
        return path



def train(model: nn.Module, source: BatchSource, config: TrainConfig, run_dir: str | Path,
          **options: Any) -> TrainResult:
    """``Trainer(model, source, config, run_dir, **options).fit()`` in one call (the same keywords)."""
    return Trainer(model, source, config, run_dir, **options).fit()
