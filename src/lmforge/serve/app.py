"""The HTTP shell: OpenAI-shaped routes over a ``workflows.serving.ModelService``; no model logic lives here.

    POST /v1/chat/completions   messages through the model's chat template (stream: server-sent events); tools
                                (tools.py) and the calls of the reply (tool_calls.py)
    POST /v1/completions        a plain prompt
    POST /v1/embeddings         encoders: the mean-pooled vector ``lmforge embed`` gives
    POST /v1/classify           fine-tuned classifiers: label and probabilities (``lmforge predict``)
    POST /v1/attention          the attention explorer page of a conversation (the chat page's button)
    POST /tokenize, /detokenize, GET /tokenizer_info    the model's tokenizer (vLLM's and llama.cpp's shapes)
    GET  /v1/models, /health, /metrics (Prometheus text), /  (the chat page)

Every request first passes the ``Guard`` (guard.py: drain, key, body size, metrics); every failure is OpenAI's
error object (errors.py). The event loop only parses, submits and streams: rendering a template, tokenizing and
every model call run in worker threads (``Served.work``), at most ``--max-queue`` + slots of them pending (429
beyond), so that no request can hold up another's answer or ``/health``. Tokens come from the engine's thread
through callbacks into an asyncio queue (reply.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from lmforge.generation.engine import Request as EngineRequest
from lmforge.serve import errors
from lmforge.serve.errors import HTTPError
from lmforge.serve.guard import Guard
from lmforge.serve.logprobs import completion_columns, token_text
from lmforge.serve.metrics import Metrics
from lmforge.serve.reply import Reply, merged
from lmforge.serve.schemas import (
    AttentionRequest,
    ChatRequest,
    ClassifyRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    Sampling,
    TokenizeRequest,
)
from lmforge.serve.tool_calls import CallReader
from lmforge.serve.tools import ToolPlan, check_history, conversation, tool_plan
from lmforge.workflows.serving import Busy, ModelService

PAGE = Path(__file__).with_name("chat.html")
WORKERS = 2  # threads that render, tokenize and run encoders: the model's own threads do the heavy work


class Served:
    """The server's state beside the model: counters, requests in flight, the drain flag, the worker threads."""

    def __init__(self, service: ModelService) -> None:
        self.service, self.options = service, service.options
        self.metrics = Metrics()
        self.in_flight = 0  # requests the Guard has let in and not yet answered (a drain waits for 0)
        self.draining = False  # set by the process on SIGTERM: new requests get 503
        self.pending = 0  # work queued on or running in the worker threads
        # beside an engine, a worker's model call (an attention page) runs on one torch thread: a second team of
        # OpenMP threads would fight the engine's for the cores (docs/serving.md "How the process is laid out")
        threads = (1,) if service.engine is not None else ()
        self.workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="lmforge-work", initargs=threads,
                                          initializer=torch.set_num_threads if threads else None)

    async def work(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on a worker thread; 429 when more is pending than the queue allows."""
        if self.pending >= self.options.max_queue + self.options.slots:
            raise HTTPError(429, "too much work waiting; retry shortly", headers={"Retry-After": "1"})
        self.pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.workers, fn, *args)
        except Busy as err:
            raise HTTPError(429, str(err), headers={"Retry-After": "1"}) from None
        finally:
            self.pending -= 1

    def check_model(self, name: str | None) -> None:
        """A request names this server's model, one of its adapters or none (OpenAI: an unknown model is 404
        model_not_found)."""
        if self.service.adapter_index(name) is None:
            served = ", ".join(map(repr, self.service.names))
            raise HTTPError(404, f"the model {name!r} does not exist here; this server serves {served} "
                            "(GET /v1/models)", "model", code="model_not_found")


def create_app(service: ModelService) -> FastAPI:
    """The app: the Guard around it, OpenAI's error object for every failure, the routes; the engine's outputs
    stage runs on the app's event loop (``EngineThread.deliver_on``)."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI):
        if service.engine is not None:
            service.engine.deliver_on(asyncio.get_running_loop())
        yield

    app = FastAPI(title="lmforge", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    state = app.state.lmforge = Served(service)
    app.add_middleware(Guard, state=state)
    errors.install(app)
    describing(app, state)
    working(app, state)
    tokenizing(app, state)
    return app


def describing(app: FastAPI, state: Served) -> None:
    """The routes that say what is served and how it is doing: /health, /metrics, /v1/models, the chat page."""
    service = state.service

    @app.get("/health")
    async def health() -> dict[str, Any]:
        waiting, busy, slots = service.load()
        return {"status": "ok", "model": service.name, "waiting": waiting, "slots_in_use": busy, "slots": slots}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = state.metrics.text(*service.load(), prefix=service.prefix_tokens(), steps=service.steps())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": service.created,
                                            "owned_by": "lmforge", "context_length": service.context,
                                            "chat": service.can("chat") is None}
                                           | ({"parent": service.name} if k else {})  # an adapter of the base
                                           for k, name in enumerate(service.names)]}

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))


def working(app: FastAPI, state: Served) -> None:
    """The routes that run the model: completions, chat completions, embeddings, classification, attention."""
    service = state.service

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        state.check_model(body.model)
        need(service.can("chat"))
        plan, ids = await state.work(chat_prompt, service, body)
        return await complete(state, request, body, ids, chat=True,
                              limit=body.max_completion_tokens or body.max_tokens, top=body.top(), plan=plan)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        state.check_model(body.model)
        need(service.can("completions"))
        prompts = body.prompts()
        fields = ["prompt"] if len(prompts) == 1 else [f"prompt[{i}]" for i in range(len(prompts))]
        ids = [await state.work(service.prompt_ids, p, f) if isinstance(p, str) else service.token_prompt(p, f)
               for p, f in zip(prompts, fields, strict=True)]
        if not body.echo and len(prompts) == 1:
            return await complete(state, request, body, ids[0], chat=False, limit=body.max_tokens, top=body.logprobs)
        return await complete_all(state, request, body, prompts, ids)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        state.check_model(body.model)
        need(service.can("embeddings"))
        vectors, tokens = await state.work(service.embed, body.texts())
        return {"object": "list", "model": service.name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]}

    @app.post("/v1/classify")
    async def classify(body: ClassifyRequest) -> dict[str, Any]:
        state.check_model(body.model)
        need(service.can("classify"))
        results = await state.work(service.classify, body.texts())
        return {"object": "list", "model": service.name, "data": [{"index": i, **r} for i, r in enumerate(results)]}

    @app.post("/v1/attention", response_class=HTMLResponse)
    async def attention(body: AttentionRequest) -> HTMLResponse:
        state.check_model(body.model)
        need(service.can("chat"))
        return HTMLResponse(await state.work(service.attention_page, body.conversation()))


def tokenizing(app: FastAPI, state: Served) -> None:
    """The tokenizer's routes, in vLLM's and llama.cpp's shapes (lm-evaluation-harness finds them)."""
    service = state.service

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        state.check_model(body.model)
        ids = await state.work(service.tokenize, body.text(), body.special())
        pieces = [{"id": i, "piece": token_text(service.tokenizer, i)} for i in ids] if body.with_pieces else None
        return {"tokens": pieces or ids, "count": len(ids), "max_model_len": service.context}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        state.check_model(body.model)
        text = await state.work(service.detokenize, body.tokens)
        return {"prompt": text, "content": text}  # vLLM's name, llama.cpp's

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        return service.tokenizer_info()


def chat_prompt(service: ModelService, body: ChatRequest) -> tuple[ToolPlan | None, list[int]]:
    """A chat request's tool plan (None: a reply of text) and its prompt's ids: the history's calls and results,
    and the tools, rendered by the template or in lmforge's words (tools.py). On a worker thread: the tools'
    schemas compile and the template renders."""
    messages = body.conversation()
    check_history(messages)
    other_format = body.response_format is not None and body.response_format.type != "text"
    plan = tool_plan(body.tools, body.tool_choice, body.parallel_tool_calls, service.tokenizer, other_format)
    messages, tools = conversation(messages, plan, service.chat_format.uses_tools)
    return plan, service.chat_ids(messages, tools)


def need(why_not: str | None) -> None:
    if why_not is not None:
        raise HTTPError(400, why_not, "model")


async def complete(state: Served, request: Request, body: Sampling, ids: list[int], chat: bool, limit: int | None,
                   top: int | None, plan: ToolPlan | None = None):
    """Queue the generation on the engine and answer with the whole reply, or stream it as server-sent events."""
    if body.n > 1:
        return await choices_of_one(state, request, body, ids, chat, limit, top, plan)
    reply, queue = start(state, body, ids, chat, limit, top, plan=plan)
    if body.stream:
        return StreamingResponse(reply.events(queue, body.include_usage()), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    answer = await reply.whole(queue, request.receive)
    return Response(status_code=499) if answer is None else JSONResponse(answer)  # 499: the client went first


async def choices_of_one(state: Served, request: Request, body: Sampling, ids: list[int], chat: bool,
                         limit: int | None, top: int | None, plan: ToolPlan | None):
    """``n`` choices of one prompt, decoded side by side (a seed gives choice k the seed + k); the prompt counted
    once in the usage, as OpenAI does."""
    started = [start(state, body.model_copy(update={"seed": None if body.seed is None else body.seed + k}), ids,
                     chat, limit, top, plan=plan) for k in range(body.n)]
    if body.stream:
        for k, (reply, _) in enumerate(started):
            reply.index = k
        return StreamingResponse(merged(started, body.include_usage(), prompt_tokens=len(ids)),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await as_choices(started, request, prompt_tokens=len(ids))


async def as_choices(started: list[tuple[Reply, asyncio.Queue]], request: Request, prompt_tokens: int):
    """The whole replies of ``started`` as the choices of one answer, in order, their usage summed (the prompt
    tokens given); 499 when the client went first."""
    answers = await asyncio.gather(*(reply.whole(queue, request.receive) for reply, queue in started))
    if any(answer is None for answer in answers):
        return Response(status_code=499)
    completion = sum(a["usage"]["completion_tokens"] for a in answers)
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
             "total_tokens": prompt_tokens + completion}
    return answers[0] | {"choices": [{**a["choices"][0], "index": k} for k, a in enumerate(answers)], "usage": usage}


def start(state: Served, body: Sampling, ids: list[int], chat: bool, limit: int | None, top: int | None,
          echo: tuple[str, list] | None = None, plan: ToolPlan | None = None) -> tuple[Reply, asyncio.Queue]:
    """Submit one generation (429 when the engine's queue is full); its Reply and the queue its callbacks feed.
    ``plan``: the request's tools, whose grammar the reply follows and whose calls it is read for."""
    service = state.service
    if service.queue_full():
        raise HTTPError(429, "too many requests waiting; retry shortly", headers={"Retry-After": "1"})
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    arrived = time.perf_counter()

    def put(kind: str) -> Callable[[Any], None]:
        return lambda value: loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

    request_ = EngineRequest(ids, max_new_tokens=min(limit or state.options.max_tokens, service.context - len(ids)),
                             temperature=body.temperature, top_k=body.top_k,
                             top_p=body.top_p if body.top_p < 1 else None, repetition_penalty=body.repetition_penalty,
                             seed=body.seed, stop_ids=service.stop_ids(chat), stop_strings=body.stop,
                             presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
                             logit_bias=service.check_bias(body.logit_bias),
                             constraint=plan.constraint() if plan is not None else body.constraint(),
                             logprobs=top, on_token=put("token") if top is not None else None, on_text=put("text"),
                             on_finish=put("end"), adapter=service.adapter_index(body.model))
    generation = service.complete(request_)
    state.metrics.prompt_tokens += len(ids)
    return Reply(state, generation, chat, arrived, echo, logprobs=top is not None,
                 calls=CallReader() if plan is not None else None), queue


async def complete_all(state: Served, request: Request, body: CompletionRequest, prompts: list, ids: list[list[int]]):
    """Several prompts, or an echoed one: each a choice of one answer, in order (not streamed). ``echo``: the
    prompt's text first, and with ``logprobs`` its tokens' log-probabilities (one forward pass on the engine's
    thread); ``max_tokens: 0`` answers only that."""
    service, top = state.service, body.logprobs
    echoes: list[tuple[str, list] | None] = []
    for prompt, p_ids in zip(prompts, ids, strict=True):
        if not body.echo:
            echoes.append(None)
            continue
        text = prompt if isinstance(prompt, str) else service.tokenizer.decode(p_ids)
        scored = await state.work(service.echo_logprobs, p_ids, top, service.adapter_index(body.model)) \
            if top is not None else []
        echoes.append((text, [(p_ids[0], None), *zip(p_ids[1:], scored, strict=True)] if top is not None else []))
    used = sum(map(len, ids))
    if body.max_tokens == 0:
        choices = [{"index": i, "text": echo[0], "finish_reason": "length", "logprobs": completion_columns(
            service.tokenizer, echo[1]) if top is not None else None} for i, echo in enumerate(echoes)]
        state.metrics.prompt_tokens += used
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": service.names[service.adapter_index(body.model)], "choices": choices,
                "usage": {"prompt_tokens": used, "completion_tokens": 0, "total_tokens": used}}
    started = [start(state, body, p_ids, False, body.max_tokens, top, echo) for p_ids, echo in
               zip(ids, echoes, strict=True)]
    return await as_choices(started, request, prompt_tokens=used)
