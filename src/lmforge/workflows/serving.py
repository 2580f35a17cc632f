"""Serving a model directory: what ``lmforge serve``'s HTTP shell (lmforge/serve/) asks of the model, with no HTTP.

    service = ModelService.open("runs/chat-model", ServeOptions(slots=8))
    g = service.complete(service.chat_ids(messages), Request(..., on_token=...))   # thread-safe
    service.embed(["a text"]), service.classify(["a text"])                      # encoders, classifiers

The decoding engine (generation/engine.py) steps in a thread of its own (``EngineThread``), or in the caller's
(``EngineThread.run``: ``lmforge serve`` steps it on the main thread and runs the HTTP server beside it): the HTTP
layer only submits requests and receives tokens through callbacks, never running the model on its event loop.
Encoders and classifiers answer in a worker thread of the caller's choosing.

Work a request asks for is bounded before it starts, cheapest check first: the body's bytes (the HTTP layer),
then its characters (a token holds at most ``longest_token`` characters, so a text of more than context x that
many characters cannot fit and is refused unread), then its tokens (the context). The attention page is bounded
by the context, ``--attention-tokens`` and a budget of weights, and runs one at a time (``Busy`` beyond).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.errors import LmforgeError
from lmforge.generation.engine import Engine, Generation, Request
from lmforge.generation.lm import LM
from lmforge.generation.requests import check_room
from lmforge.workflows.options import Runtime, ServeOptions, TemplateOptions, Weights

ATTENTION_WEIGHTS = 1_500_000  # layers x heads x tokens² numbers an attention page holds at most (~10 MB)


class Busy(LmforgeError):
    """The model is taken by a request of the same kind and no more may wait (the HTTP answer: 429)."""


class EngineThread:
    """The engine's loop: it steps while anything is waiting or active, and sleeps otherwise; in a daemon thread
    of its own (``start=True``) or in the thread that calls ``run``. The outputs stage (detokenizing, stop
    strings, the requests' callbacks) runs where ``deliver_on`` says: the HTTP server's event loop, which a step
    hands its touched requests to in one call, so that a slow or failing callback never holds up a step and no
    third thread takes the interpreter lock from the engine's operations.

    Why a caller may want the loop on its main thread: PyTorch's CPU threads come from OpenMP, which keeps a team
    of worker threads for each thread that runs parallel work. A model loaded on the main thread and stepped on
    another makes two teams; libgomp then has more threads than cores and spins only briefly before sleeping, and
    every parallel region of a step pays the wake-up (docs/serving.md, docs/benchmarks.md)."""

    JOB_SHARE = 0.25  # at most this part of the engine's time goes to other model calls while requests decode

    def __init__(self, engine: Engine, start: bool = True) -> None:
        self.engine = engine
        self.wake = threading.Event()
        self.stopping = False
        self.steps, self.busy = 0, 0.0  # steps taken, and seconds spent in them (/metrics)
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future]] = queue.SimpleQueue()
        self.job_due = 0.0  # monotonic time before which no job runs while requests decode
        self.thread = threading.Thread(target=self.run, name="lmforge-engine", daemon=True) if start else None
        if self.thread is not None:
            self.thread.start()

    def submit(self, request: Request) -> Generation:
        generation = self.engine.submit(request)
        self.wake.set()
        return generation

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run on the engine's thread between two steps (another model call: an attention page), its
        result or its exception. One thread runs the model: a second would start a second team of OpenMP threads
        that fights the engine's for the cores. While requests decode, such calls take at most ``JOB_SHARE`` of
        the engine's time (a call waits); an idle engine runs them at once."""
        return self.call_soon(fn, *args).result()

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """``call`` without the wait: the future of ``fn(*args)``."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.jobs.put((functools.partial(fn, *args), future))
        self.wake.set()
        return future

    def load(self) -> tuple[int, int, int]:
        """(waiting, slots in use, slots)."""
        return self.engine.scheduler.load()

    def prefix_counts(self) -> tuple[int, int]:
        """Prompt tokens the prefix cache supplied and those computed ((0, 0) without one)."""
        prefix = self.engine.runner.prefix
        return (prefix.hits, prefix.misses) if prefix else (0, 0)

    def cancel_all(self) -> None:
        self.engine.cancel_all()

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Step in this thread until ``until()`` is true (checked between steps and at least every 0.2 s) or
        ``stop()`` is called; run the calls that wait (``call``) between steps."""
        while not self.stopping and not until():
            idle = self.engine.idle()
            if not self.jobs.empty() and (idle or (time.monotonic() >= self.job_due and not self.engine.waiting())):
                self.run_job()
                continue
            if idle:
                self.wake.wait(0.2)
                self.wake.clear()
                continue
            began = time.perf_counter()
            self.engine.step()
            self.steps, self.busy = self.steps + 1, self.busy + time.perf_counter() - began

    def run_job(self) -> None:
        fn, future = self.jobs.get()
        began = time.monotonic()
        try:
            future.set_result(fn())
        except BaseException as err:  # handed to the caller, whatever it is
            future.set_exception(err)
        spent = time.monotonic() - began
        self.job_due = time.monotonic() + spent * (1 - self.JOB_SHARE) / self.JOB_SHARE

    def deliver_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run the outputs stage on ``loop`` (an asyncio event loop in another thread): each step hands it the
        requests it touched, in order, in one call."""
        outputs = self.engine.outputs
        self.engine.sink = lambda touched: loop.call_soon_threadsafe(outputs.process, touched)

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping = True
        self.wake.set()
        if self.thread is not None:
            self.thread.join(timeout)
        while not self.jobs.empty():  # nobody will run them now
            self.jobs.get()[1].set_exception(LmforgeError("the server is stopping"))


class ModelService:
    """One model directory behind the HTTP API: its capabilities, the engine thread, the limits, the metrics."""

    def __init__(self, model: nn.Module, tokenizer: Any, name: str, options: ServeOptions,
                 chat_format: Any = None, info: dict[str, Any] | None = None, engine_thread: bool = True) -> None:
        from lmforge.generation.adapters import selector_of
        from lmforge.models.interfaces import generates_text

        self.model, self.tokenizer, self.name, self.options = model, tokenizer, name, options
        selector = selector_of(model)
        self.names = [name, *(selector.names if selector else [])]  # what a request's model may be: index 0 the
        if len(set(self.names)) != len(self.names):  # base, k the k-th --adapter (Request.adapter)
            raise LmforgeError(f"--adapter: the names {', '.join(self.names[1:])} must differ from each other and "
                               f"from the base model's, {name!r}")
        self.chat_format, self.info = chat_format, info or {}
        self.created = int(time.time())
        self.generates = generates_text(model) and "Classification" not in type(model).__name__
        self.context = getattr(model.config, "max_positions", 0)
        self.engine: EngineThread | None = None
        self.warmup: tuple[int, float, str] | None = None  # (graphs, seconds, how: recorded | compiled) at start
        if self.generates:
            self.lm = LM(model, tokenizer, chat_format, slots=options.slots, capacity=options.context,
                         compile=options.compile, prefix_blocks=options.prefix_cache, log=True,
                         kv_cache=None if options.kv_cache == "model" else options.kv_cache)
            engine = self.lm.engine
            self.context = engine.capacity
            began = time.perf_counter()
            graphs = engine.warmup()  # compiled: every graph before the first request, none while serving
            how = "compiled" if engine.runner.name != "graphs" else (  # torch.compile's, or CUDA graphs
                "compiled and recorded" if engine.runner.step_fn is not engine.runner.lean
                else "recorded")
            self.warmup = (graphs, time.perf_counter() - began, how) if graphs else None
            self.engine = EngineThread(engine, start=engine_thread)  # else the caller runs it (EngineThread.run)
        self.model_lock = threading.Lock()  # encoders and classifiers: one batch at a time

    @classmethod
    def open(cls, path: str | Path, options: ServeOptions, runtime: Runtime | None = None,
             engine_thread: bool = True, template: TemplateOptions | None = None,
             weights: Weights | None = None) -> ModelService:
        """Load a model directory (verified like every other read) for serving; ``engine_thread=False``: the
        caller steps the engine itself (``service.engine.run``); ``template``: its chat template's budget."""
        from lmforge.interop.directories import load, load_finetuned, with_dtype
        from lmforge.workflows.chat import chat_format

        runtime, weights = runtime or Runtime(), weights or Weights()
        folder = Path(path)
        info: dict[str, Any] = {}
        if (folder / "finetune.json").is_file() or (folder / "adapter_config.json").is_file():
            model, tokenizer, info = load_finetuned(folder, runtime.device)
            model = with_dtype(model, weights.dtype, weights.group_size)
        else:
            model, tokenizer = load(folder, device=runtime.device, dtype=weights.dtype, group_size=weights.group_size)
        add_adapters(model, folder, options)  # a fine-tuned --model has no weights' sha256 an adapter could name
        if tokenizer is None:
            raise LmforgeError(f"--model: {folder} has no tokenizer; the server reads and writes text")
        model = model.eval()
        name = folder.resolve().stem if folder.is_file() else folder.resolve().name  # a GGUF file: without .gguf
        fmt = chat_format(folder, tokenizer, model, (template or TemplateOptions()).limits())
        return cls(model, tokenizer, name, options, fmt, info, engine_thread)

    # -- capabilities ---------------------------------------------------------------------------------------
    def adapter_index(self, name: str | None) -> int | None:
        """The adapter a request's ``model`` names (``Request.adapter``): 0 the base (or no name), k the k-th
        --adapter; None when this server does not serve that name."""
        return 0 if name is None else self.names.index(name) if name in self.names else None

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
        return self.engine.load() if self.engine is not None else (0, 0, 0)

    def prefix_tokens(self) -> tuple[int, int]:
        """Prompt tokens the prefix cache supplied and those computed, for /metrics ((0, 0) without one)."""
        return self.engine.prefix_counts() if self.engine is not None else (0, 0)

    def steps(self) -> tuple[int, float]:
        """The engine's steps so far and the seconds they took, for /metrics ((0, 0.0) without an engine)."""
        return (self.engine.steps, self.engine.busy) if self.engine else (0, 0.0)

    # -- the work -------------------------------------------------------------------------------------------
    @functools.cached_property
    def longest_token(self) -> int:
        """The most characters one token stands for (its stored form is at least as long as the text it makes)."""
        return max((len(t) for t, i in self.tokenizer.vocab.items() if i not in self.tokenizer.special_ids),
                   default=1)

    def check_characters(self, n: int, field: str) -> None:
        """Refuse, before any tokenizing, a text of ``n`` characters that cannot fit the context in any tokenization."""
        if n > self.context * self.longest_token:
            raise LmforgeError(f"{field}: {n} characters are more than {self.context} tokens in any tokenization "
                               f"(the model's context; a token holds at most {self.longest_token} characters)")

    def prompt_ids(self, text: str, field: str = "prompt") -> list[int]:
        """A completion's prompt: plain text (a special token's name written in it is text, not a control token)."""
        self.check_characters(len(text), field)
        ids = self.tokenizer.encode(text, add_special_tokens=False, allow_special=False).ids
        check_room(len(ids), 1, self.context, field)
        return ids

    def tokenize(self, text: str, special: bool) -> list[int]:
        """/tokenize: ``text``'s ids, special-token names in it read as those tokens (``special``: the model's own
        start and end tokens added); bounded by the context's worth of characters."""
        self.check_characters(len(text), "prompt")
        return self.tokenizer.encode(text, add_special_tokens=special).ids

    def in_vocabulary(self, ids: Iterable[int], field: str) -> None:
        """Refuse, naming ``field``, a token id that is not in the tokenizer's vocabulary."""
        size = len(self.tokenizer.id_to_token)
        if (bad := next((i for i in ids if not 0 <= i < size), None)) is not None:
            raise LmforgeError(f"{field}: token id {bad} is not in the vocabulary (0..{size - 1})")

    def detokenize(self, ids: list[int]) -> str:
        """/detokenize: the text of ``ids`` (special tokens written as their names)."""
        self.in_vocabulary(ids, "tokens")
        return self.tokenizer.decode(ids)

    def tokenizer_info(self) -> dict[str, Any]:
        """/tokenizer_info: what a client needs to build prompts itself (lm-evaluation-harness reads it)."""
        t = self.tokenizer
        name = {role: t.roles.get(role) for role in ("bos", "eos", "pad", "unk")}
        return {f"{role}_token": token for role, token in name.items()} | {
            "chat_template": getattr(t, "chat_template", None), "vocab_size": len(t.id_to_token),
            "model_max_length": self.context, "special_tokens": sorted(t.special_tokens)}

    def check_bias(self, bias: dict[int, float] | None) -> dict[int, float] | None:
        """A request's logit_bias, its token ids in the vocabulary."""
        self.in_vocabulary(bias or (), "logit_bias")
        return bias

    def token_prompt(self, ids: list[int], field: str = "prompt") -> list[int]:
        """A completion's prompt given as token ids: each in the vocabulary, the whole within the context."""
        self.in_vocabulary(ids, field)
        check_room(len(ids), 1, self.context, field)
        return ids

    def echo_logprobs(self, ids: list[int], top: int,
                      adapter: int = 0) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        """``prompt_logprobs`` run on the engine's thread (any thread may call it; it waits)."""
        if self.engine is None:
            raise LmforgeError("this model does not generate text")
        return self.engine.call(self.prompt_logprobs, ids, top, adapter)

    def prompt_logprobs(self, ids: list[int], top: int,
                        adapter: int = 0) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
        """Each prompt token's log-probability given the ones before it (the first has none: the list starts at
        the second), with ``top`` alternatives: what ``echo`` with ``logprobs`` answers. On the engine's thread
        (``engine.call``), as one forward pass (under ``adapter``); the vocabulary's log-softmax 256 positions at a
        time."""
        from lmforge.generation.adapters import selector_of
        from lmforge.generation.sampling import token_logprobs

        selector, device = selector_of(self.model), next(self.model.parameters()).device
        under = selector.using(torch.tensor([adapter], device=device)) if selector else contextlib.nullcontext()
        with torch.inference_mode(), under:
            h = self.model(torch.tensor([ids]), logits_to_keep=1).last_hidden_state[0, :-1]  # (T-1, D)
            out = []
            for start in range(0, len(ids) - 1, 256):
                logits = self.model.head(h[start: start + 256])  # (≤256, V): position t predicts token t + 1
                out += [token_logprobs(row, ids[start + k + 1], top) for k, row in enumerate(logits)]
        return out

    def chat_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The conversation through the model's own chat template, ready for the assistant's reply (``tools``: to
        a template with a tools section)."""
        self.check_characters(sum(len(m["content"]) for m in messages), "messages")
        ids = self.chat_format.prompt_ids(messages, tools)
        check_room(len(ids), 1, self.context, "messages")
        return ids

    def stop_ids(self, chat: bool) -> list[int]:
        """The model's stop tokens (``special_ids``), and a chat reply's end-of-turn tokens."""
        from lmforge.models.interfaces import special_ids

        return special_ids(self.model, self.tokenizer).ending(self.chat_format.stop_ids if chat else ())

    def complete(self, request: Request) -> Generation:
        """Queue a generation on the engine thread (any thread; tokens arrive through the request's callbacks)."""
        if self.engine is None:
            raise LmforgeError("this model does not generate text")
        return self.engine.submit(request)

    def embed(self, texts: list[str]) -> tuple[list[list[float]], int]:
        """The mean-pooled last hidden state of each text (what ``lmforge embed`` gives), and the tokens read. A text
        is read up to the context, so characters beyond the context's worth are never tokenized."""
        from lmforge.workflows.embed import embed

        texts = self.within_context(texts)
        with self.model_lock:
            vectors = embed(self.model, self.tokenizer, texts).tolist()
        tokens = sum(min(len(self.tokenizer.encode(t).ids), self.context) for t in texts)
        return vectors, tokens

    def classify(self, texts: list[str]) -> list[dict[str, Any]]:
        """Label and probabilities of each text: what ``lmforge predict`` gives (a text that cannot fit the context
        in any tokenization is refused: a word-labelling model labels every word it is given)."""
        from lmforge.workflows.classify import predict_lines

        for i, text in enumerate(texts):
            self.check_characters(len(text), f"input[{i}]")
        with self.model_lock:
            return predict_lines(self.model, self.tokenizer, self.info, texts)

    def within_context(self, texts: list[str]) -> list[str]:
        """Each text cut to the characters that can reach the model (an encoder reads its first ``context``
        tokens, which lie in its first ``context`` x ``longest_token`` characters): the same result, bounded work."""
        most = self.context * self.longest_token
        return [t[:most] for t in texts]

    def attention_tokens(self) -> int:
        """The most tokens an attention page shows: the context, ``--attention-tokens`` and ATTENTION_WEIGHTS."""
        heads = sum(m.n_heads for m in self.model.modules() if hasattr(m, "n_heads") and hasattr(m, "d_qk"))
        return max(1, min(self.context, self.options.attention_tokens, math.isqrt(ATTENTION_WEIGHTS // max(heads, 1))))

    def attention_page(self, messages: list[dict[str, Any]]) -> str:
        """The attention explorer (one self-contained HTML page) of a rendered conversation's last
        ``attention_tokens()`` tokens; one page at a time (``Busy`` while another is made). The model call and the
        page's writing both run on the engine's thread (``EngineThread.call``): neither a second team of OpenMP
        threads nor a second thread busy in Python (each of a step's ~2,000 operations waits for the interpreter
        lock while another thread holds it) slows the requests that decode."""
        self.check_characters(sum(len(m["content"]) for m in messages), "messages")
        if not self.model_lock.acquire(blocking=False):  # before any work: a flood costs a refusal each
            raise Busy("an attention page is being made; retry shortly")
        try:
            ids = self.chat_format.conversation_ids(messages, add_generation_prompt=False)
            keep = self.attention_tokens()
            shown = f" (its last {keep} of {len(ids)} tokens)" if len(ids) > keep else ""
            return self.engine.call(self.page, ids[-keep:], self.name + shown)
        finally:
            self.model_lock.release()

    def page(self, ids: list[int], title: str) -> str:
        """The attention explorer of ``ids`` (the engine's thread runs it: ``attention_page``)."""
        from lmforge.viz.explorer import attention_page
        from lmforge.workflows.inspect import attention_maps

        maps = attention_maps(self.model, self.tokenizer, self.tokenizer.decode(ids), ids=ids)
        return attention_page(maps, model_name=title)

    def cancel_all(self) -> None:
        """Cancel every request waiting or decoding (a drain past its grace); each ends at the engine's next step."""
        if self.engine is not None:
            self.engine.cancel_all()

    def close(self) -> None:
        if self.engine is not None:
            self.engine.stop()


def add_adapters(model: nn.Module, base: Path, options: ServeOptions) -> None:
    """``--adapter NAME=DIR``: each LoRA directory read and checked against the base's weights (their sha256), all
    of them put over the model's layers (generation/adapters.py), where each request's ``adapter`` picks one."""
    from lmforge.generation.adapters import LoRAFactors, install_adapters
    from lmforge.interop.directories import read_lora, weights_sha256

    options.validate()
    if not options.adapter:
        return
    trained_on = weights_sha256(base)
    install_adapters(model, [LoRAFactors(name, *read_lora(Path(folder), trained_on))
                             for name, folder in options.adapters()])
