"""Serving a model directory: what ``lmforge serve``'s HTTP shell (lmforge/serve/) asks of the model, with no HTTP.

    service = ModelService.open("runs/chat-model", ServeOptions(slots=8))
    g = service.complete(service.chat_ids(messages), Request(..., on_token=...))   # thread-safe
    service.embed(["a text"]), service.classify(["a text"])                      # encoders, classifiers

The decoding engine (generation/engine.py) steps in a thread of its own (``EngineThread``), or in the caller's
(``EngineThread.run``: ``lmforge serve`` steps it on the main thread and runs the HTTP server beside it): the HTTP
layer only submits requests and receives tokens through callbacks, never running the model on its event loop.
Encoders and classifiers answer in a worker thread of the caller's choosing. ``Metrics`` counts what ``/metrics``
shows.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.calls import compile_mode
from lmforge.generation.engine import Engine, Generation, Request
from lmforge.workflows.options import Runtime, ServeOptions

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class EngineThread:
    """The engine's loop: it steps while anything is waiting or active, and sleeps otherwise; in a daemon thread
    of its own (``start=True``) or in the thread that calls ``run``.

    Why a caller may want the loop on its main thread: PyTorch's CPU threads come from OpenMP, which keeps a team
    of worker threads for each thread that runs parallel work. A model loaded on the main thread and stepped on
    another makes two teams; libgomp then has more threads than cores and spins only briefly before sleeping, and
    every parallel region of a step pays the wake-up: a SmolLM2 step took 180-200 ms on a second thread against
    120-130 ms on the loading one (2 cores, torch 2.13, measured alternately)."""

    def __init__(self, engine: Engine, start: bool = True) -> None:
        self.engine = engine
        self.wake = threading.Event()
        self.stopping = False
        self.steps, self.busy = 0, 0.0  # steps taken, and seconds spent in them (/metrics)
        self.thread = threading.Thread(target=self.run, name="lmforge-engine", daemon=True) if start else None
        if self.thread is not None:
            self.thread.start()

    def submit(self, request: Request) -> Generation:
        generation = self.engine.submit(request)
        self.wake.set()
        return generation

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Step in this thread until ``until()`` is true (checked between steps and at least every 0.2 s) or
        ``stop()`` is called."""
        while not self.stopping and not until():
            if self.engine.idle():
                self.wake.wait(0.2)
                self.wake.clear()
                continue
            began = time.perf_counter()
            self.engine.step()
            self.steps, self.busy = self.steps + 1, self.busy + time.perf_counter() - began

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)


@dataclass
class Metrics:
    """Counters for Prometheus' text format (``/metrics``)."""

    requests: Counter = field(default_factory=Counter)  # (endpoint, status) -> count
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_sum: float = 0.0
    ttft_count: int = 0
    ttft_buckets: Counter = field(default_factory=Counter)  # upper bound (s) -> count
    lock: threading.Lock = field(default_factory=threading.Lock)

    BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

    def first_token(self, seconds: float) -> None:
        with self.lock:
            self.ttft_sum += seconds
            self.ttft_count += 1
            for bound in self.BOUNDS:
                if seconds <= bound:
                    self.ttft_buckets[bound] += 1

    def text(self, queue: int, busy: int, slots: int, prefix: tuple[int, int] = (0, 0),
             steps: tuple[int, float] = (0, 0.0)) -> str:
        """The counters; ``prefix``: prompt tokens taken from the prefix cache and computed (its hits and misses);
        ``steps``: the engine's steps and the seconds they took (busy / wall time: how loaded it is)."""
        lines = ["# HELP lmforge_requests_total HTTP requests by endpoint and status code",
                 "# TYPE lmforge_requests_total counter"]
        lines += [f'lmforge_requests_total{{endpoint="{e}",status="{s}"}} {n}' for (e, s), n in
                  sorted(self.requests.items())]
        lines += ["# TYPE lmforge_prompt_tokens_total counter", f"lmforge_prompt_tokens_total {self.prompt_tokens}",
                  "# TYPE lmforge_completion_tokens_total counter",
                  f"lmforge_completion_tokens_total {self.completion_tokens}",
                  "# TYPE lmforge_queue_length gauge", f"lmforge_queue_length {queue}",
                  "# TYPE lmforge_slots_in_use gauge", f"lmforge_slots_in_use {busy}",
                  "# TYPE lmforge_slots gauge", f"lmforge_slots {slots}",
                  "# HELP lmforge_prefix_cached_tokens_total prompt tokens whose keys and values came from the cache",
                  "# TYPE lmforge_prefix_cached_tokens_total counter",
                  f"lmforge_prefix_cached_tokens_total {prefix[0]}",
                  "# TYPE lmforge_prefix_computed_tokens_total counter",
                  f"lmforge_prefix_computed_tokens_total {prefix[1]}",
                  "# HELP lmforge_engine_steps_total engine steps (admissions, prefills and one decoded token a slot)",
                  "# TYPE lmforge_engine_steps_total counter", f"lmforge_engine_steps_total {steps[0]}",
                  "# HELP lmforge_engine_busy_seconds_total seconds the engine spent stepping",
                  "# TYPE lmforge_engine_busy_seconds_total counter",
                  f"lmforge_engine_busy_seconds_total {steps[1]:.6f}",
                  "# HELP lmforge_time_to_first_token_seconds from a request's arrival to its first token",
                  "# TYPE lmforge_time_to_first_token_seconds histogram"]
        cumulative = 0
        for bound in self.BOUNDS:
            cumulative = self.ttft_buckets[bound]
            lines.append(f'lmforge_time_to_first_token_seconds_bucket{{le="{bound}"}} {cumulative}')
        lines += [f'lmforge_time_to_first_token_seconds_bucket{{le="+Inf"}} {self.ttft_count}',
                  f"lmforge_time_to_first_token_seconds_sum {self.ttft_sum:.6f}",
                  f"lmforge_time_to_first_token_seconds_count {self.ttft_count}"]
        return "\n".join(lines) + "\n"


class ModelService:
    """One model directory behind the HTTP API: its capabilities, the engine thread, the limits, the metrics."""

    def __init__(self, model: nn.Module, tokenizer: Any, name: str, options: ServeOptions,
                 chat_format: Any = None, info: dict[str, Any] | None = None, engine_thread: bool = True) -> None:
        from lmforge.models.interfaces import generates_text

        self.model, self.tokenizer, self.name, self.options = model, tokenizer, name, options
        self.chat_format, self.info = chat_format, info or {}
        self.metrics = Metrics()
        self.created = int(time.time())
        self.generates = generates_text(model) and "Classification" not in type(model).__name__
        self.context = getattr(model.config, "max_positions", 0)
        self.engine: EngineThread | None = None
        self.warmup: tuple[int, float] | None = None  # compiled engines: (graphs, seconds) made at start
        if self.generates:
            engine = Engine(model, options.slots, capacity=options.context or None, tokenizer=tokenizer,
                            compile=compile_mode(model, options.compile), prefix_blocks=options.prefix_cache)
            self.context = engine.capacity
            began = time.perf_counter()
            graphs = engine.warmup()  # compiled: every graph before the first request, none while serving
            self.warmup = (graphs, time.perf_counter() - began) if graphs else None
            self.engine = EngineThread(engine, start=engine_thread)  # else the caller runs it (EngineThread.run)
        self.model_lock = threading.Lock()  # encoders and classifiers: one batch at a time

    @classmethod
    def open(cls, path: str | Path, options: ServeOptions, runtime: Runtime | None = None,
             engine_thread: bool = True) -> ModelService:
        """Load a model directory (verified like every other read) for serving; ``engine_thread=False``: the
        caller steps the engine itself (``service.engine.run``)."""
        from lmforge.interop.directories import load, load_finetuned
        from lmforge.workflows.chat import chat_format

        runtime = runtime or Runtime()
        folder = Path(path)
        info: dict[str, Any] = {}
        if (folder / "finetune.json").is_file() or (folder / "adapter_config.json").is_file():
            model, tokenizer, info = load_finetuned(folder, runtime.device)
        else:
            model, tokenizer = load(folder, device=runtime.device)
        if tokenizer is None:
            raise LmforgeError(f"--model: {folder} has no tokenizer; the server reads and writes text")
        model = model.to(DTYPES[options.dtype]).eval()
        return cls(model, tokenizer, folder.resolve().name, options, chat_format(folder, tokenizer, model), info,
                   engine_thread)

    # -- capabilities ---------------------------------------------------------------------------------------
    def can(self, endpoint: str) -> str | None:
        """None when this model serves ``endpoint``, else why not (the 400 the API answers)."""
        kind = type(self.model).__name__
        if endpoint in ("chat", "completions") and not self.generates:
            return f"the model {self.name} is a {kind}: it does not generate text"
        if endpoint == "chat" and self.chat_format is None:
            return f"the model {self.name} has no chat template; use /v1/completions"
        if endpoint == "embeddings" and (self.generates or "Classification" in kind):
            return f"the model {self.name} is a {kind}: embeddings come from encoders (BERT-style models)"
        if endpoint == "classify" and not self.info.get("labels"):
            return f"the model {self.name} is not a fine-tuned classifier"
        return None

    def queue_full(self) -> bool:
        """Whether a new request would have to wait beyond ``--max-queue``: the free slots take the first ones."""
        waiting, busy, slots = self.load()
        return self.engine is not None and waiting >= self.options.max_queue + slots - busy

    def load(self) -> tuple[int, int, int]:
        """(waiting, slots in use, slots) for /metrics, /health and the queue limit."""
        if self.engine is None:
            return 0, 0, 0
        e = self.engine.engine
        return len(e.waiting), len(e.active), e.n_slots

    def prefix_tokens(self) -> tuple[int, int]:
        """Prompt tokens the prefix cache supplied and those computed, for /metrics ((0, 0) without one)."""
        prefix = self.engine.engine.prefix if self.engine else None
        return (prefix.hits, prefix.misses) if prefix else (0, 0)

    def steps(self) -> tuple[int, float]:
        """The engine's steps so far and the seconds they took, for /metrics ((0, 0.0) without an engine)."""
        return (self.engine.steps, self.engine.busy) if self.engine else (0, 0.0)

    # -- the work -------------------------------------------------------------------------------------------
    def prompt_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The conversation through the model's own chat template, ready for the assistant's reply."""
        return self.chat_format.prompt_ids(messages)

    def stop_ids(self, chat: bool) -> list[int]:
        eos = getattr(self.model.config, "eos_id", None)
        stops = {eos} if eos is not None else set()
        if chat:
            stops |= set(self.chat_format.stop_ids)
        return sorted(stops)

    def complete(self, request: Request) -> Generation:
        """Queue a generation on the engine thread (any thread; tokens arrive through the request's callbacks)."""
        if self.engine is None:
            raise LmforgeError("this model does not generate text")
        self.metrics.prompt_tokens += len(request.ids)
        return self.engine.submit(request)

    def embed(self, texts: list[str]) -> list[list[float]]:
        """The mean-pooled last hidden state of each text: what ``lmforge embed`` gives."""
        from lmforge.workflows.embed import embed

        with self.model_lock:
            return embed(self.model, self.tokenizer, texts).tolist()

    def classify(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and probabilities of each text: what ``lmforge predict`` gives."""
        from lmforge.workflows.classify import predict_lines

        with self.model_lock:
            return predict_lines(self.model, self.tokenizer, self.info, texts)

    def attention_page(self, messages: list[dict[str, Any]]) -> str:
        """The attention explorer (one self-contained HTML page) of a rendered conversation."""
        from lmforge.viz.explorer import attention_page
        from lmforge.workflows.inspect import attention_maps

        text = self.chat_format.render(messages, add_generation_prompt=False)
        with self.model_lock:
            maps = attention_maps(self.model, self.tokenizer, text)
        return attention_page(maps, model_name=self.name)

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()
