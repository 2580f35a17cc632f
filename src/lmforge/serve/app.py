"""The HTTP shell: OpenAI-shaped routes over a ``workflows.serving.ModelService``; no model logic lives here.

    POST /v1/chat/completions   messages through the model's chat template (stream: server-sent events)
    POST /v1/completions        a plain prompt
    POST /v1/embeddings         encoders: the mean-pooled vector ``lmforge embed`` gives
    POST /v1/classify           fine-tuned classifiers: label and probabilities (``lmforge predict``)
    POST /v1/attention          the attention explorer page of a conversation (the chat page's button)
    GET  /v1/models, /health, /metrics (Prometheus text), /  (the chat page)

Every route answers in the OpenAI error shape on failure: 400 for a bad request (naming the field), 401 without
the bearer key, 413 for a body over ``--max-body``, 429 (with Retry-After) when the queue is full, 500 when the
model fails on one request (the server goes on). Tokens come from the engine's thread through callbacks into an
asyncio queue: the event loop never runs the model. A client that goes away cancels its request, which frees
its slot at the engine's next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse

from lmforge.errors import LmforgeError
from lmforge.generation.engine import Request as EngineRequest
from lmforge.generation.text import Detokenizer
from lmforge.serve.schemas import (
    AttentionRequest,
    ChatRequest,
    ClassifyRequest,
    CompletionRequest,
    EmbeddingRequest,
    Sampling,
)
from lmforge.workflows.serving import ModelService

PAGE = Path(__file__).with_name("chat.html")


class HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers


def error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
          headers: dict[str, str] | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


def create_app(service: ModelService) -> FastAPI:
    app = FastAPI(title="lmforge", docs_url=None, redoc_url=None, openapi_url=None)
    options = service.options

    @app.middleware("http")
    async def guard(request: Request, call_next):
        start = time.perf_counter()
        response = checked(request) or await call_next(request)
        path = request.url.path
        service.metrics.requests[(path, response.status_code)] += 1
        print(json.dumps({"time": round(time.time(), 3), "method": request.method, "path": path,
                          "status": response.status_code, "ms": round(1000 * (time.perf_counter() - start), 1)}),
              file=sys.stderr, flush=True)
        return response

    def checked(request: Request) -> Response | None:
        """The key (compared in constant time) and the body's size, before anything is read."""
        if options.api_key and request.url.path.startswith("/v1/"):
            given = request.headers.get("authorization", "").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), options.api_key.encode()):
                return error(401, "missing or wrong API key (Authorization: Bearer KEY)", kind="authentication_error")
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > options.max_body):
            return error(413, f"the request body is over {options.max_body} bytes (--max-body)")
        return None

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        param = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return error(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param or None)

    @app.exception_handler(HTTPError)
    async def http_error(_: Request, err: HTTPError) -> JSONResponse:
        return error(err.status, err.message, err.param, err.kind, err.headers)

    @app.exception_handler(LmforgeError)
    async def refused(_: Request, err: LmforgeError) -> JSONResponse:
        return error(400, str(err))

    @app.exception_handler(Exception)
    async def failed(_: Request, err: Exception) -> JSONResponse:
        return error(500, f"{type(err).__name__}: {err}", kind="server_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        waiting, busy, slots = service.load()
        return {"status": "ok", "model": service.name, "waiting": waiting, "slots_in_use": busy, "slots": slots}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        text = service.metrics.text(*service.load(), prefix=service.prefix_tokens(), steps=service.steps())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": service.name, "object": "model", "created": service.created,
                                            "owned_by": "lmforge", "context_length": service.context,
                                            "chat": service.can("chat") is None}]}

    @app.get("/", response_class=HTMLResponse)
    async def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(encoding="utf-8"))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        need(service.can("chat"))
        ids = service.chat_ids([m.model_dump(exclude_none=True) for m in body.messages])
        return await complete(service, request, body, ids, chat=True,
                              limit=body.max_completion_tokens or body.max_tokens)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        need(service.can("completions"))
        return await complete(service, request, body, service.prompt_ids(body.prompt), chat=False,
                              limit=body.max_tokens)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        need(service.can("embeddings"))
        texts = body.texts()
        vectors = await asyncio.to_thread(service.embed, texts)
        tokens = sum(len(service.prompt_ids(t)) for t in texts)
        return {"object": "list", "model": service.name, "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)]}

    @app.post("/v1/classify")
    async def classify(body: ClassifyRequest) -> dict[str, Any]:
        need(service.can("classify"))
        results = await asyncio.to_thread(service.classify, body.texts())
        return {"object": "list", "model": service.name, "data": [{"index": i, **r} for i, r in enumerate(results)]}

    @app.post("/v1/attention", response_class=HTMLResponse)
    async def attention(body: AttentionRequest) -> HTMLResponse:
        need(service.can("chat"))
        messages = [m.model_dump(exclude_none=True) for m in body.messages]
        return HTMLResponse(await asyncio.to_thread(service.attention_page, messages))

    return app


def need(why_not: str | None) -> None:
    if why_not is not None:
        raise HTTPError(400, why_not, "model")


async def complete(service: ModelService, request: Request, body: Sampling, ids: list[int], chat: bool,
                   limit: int | None):
    """Queue the generation on the engine and answer with the whole reply, or stream it as server-sent events."""
    room = service.context - len(ids)
    if room < 1:
        raise HTTPError(400, f"the prompt is {len(ids)} tokens, the model's context {service.context}",
                        "messages" if chat else "prompt")
    if service.queue_full():
        raise HTTPError(429, "too many requests waiting; retry shortly", kind="rate_limit_error",
                        headers={"Retry-After": "1"})
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    stops = service.stop_ids(chat)
    arrived = time.perf_counter()

    def on_token(token: int) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("token", token))

    def on_finish(generation) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, ("end", generation))

    request_ = EngineRequest(ids, max_new_tokens=min(limit or service.options.max_tokens, room),
                          temperature=body.temperature, top_k=body.top_k,
                          top_p=body.top_p if body.top_p < 1 else None, repetition_penalty=body.repetition_penalty,
                          seed=body.seed, stop_ids=stops, stop_strings=body.stop, on_token=on_token,
                          on_finish=on_finish)
    generation = service.complete(request_)
    text = Detokenizer(service.tokenizer, body.stop, skip=stops)
    reply = Reply(service, generation, text, chat, arrived)
    if body.stream:
        return StreamingResponse(reply.events(queue, body.include_usage()), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return JSONResponse(await reply.whole(queue, request))


class Reply:
    """One request's tokens turned into the OpenAI shapes (whole, or as chunks)."""

    def __init__(self, service: ModelService, generation: Any, text: Detokenizer, chat: bool, arrived: float) -> None:
        self.service, self.generation, self.text, self.chat, self.arrived = service, generation, text, chat, arrived
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.first = True

    def token(self, value: int) -> str:
        if self.first:
            self.service.metrics.first_token(time.perf_counter() - self.arrived)
            self.first = False
        self.service.metrics.completion_tokens += 1
        return self.text.add(value)

    def reason(self) -> str:
        return "length" if self.generation.finish_reason == "length" else "stop"

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.generation.request.ids), len(self.generation.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def whole(self, queue: asyncio.Queue, request: Request) -> dict[str, Any]:
        try:
            while True:
                try:
                    kind, value = await asyncio.wait_for(queue.get(), timeout=1.0)
                except TimeoutError:
                    if await request.is_disconnected():
                        raise asyncio.CancelledError from None
                    continue
                if kind == "token":
                    self.token(value)
                    continue
                break
        finally:
            self.generation.cancel()  # no-op once it has ended; frees the slot if the client went away
        if self.generation.finish_reason == "error":
            raise HTTPError(500, f"the model failed on this request: {self.generation.error}", kind="server_error")
        content = self.text.text
        choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if self.chat else
                  {"index": 0, "text": content})
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.service.name, "usage": self.usage(),
                "choices": [{**choice, "finish_reason": self.reason(), "logprobs": None}]}

    def chunk(self, content: str | None, reason: str | None = None, role: bool = False) -> str:
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": content} if content is not None else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": content or ""}
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.service.name,
                "choices": [{**choice, "finish_reason": reason, "logprobs": None}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    async def events(self, queue: asyncio.Queue, include_usage: bool):
        try:
            if self.chat:
                yield self.chunk("", role=True)
            while True:
                kind, value = await queue.get()
                if kind == "token":
                    new = self.token(value)
                    if new:
                        yield self.chunk(new)
                    continue
                if self.generation.finish_reason == "error":
                    message = f"the model failed on this request: {self.generation.error}"
                    yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
                    return
                rest = self.text.finish()
                if rest:
                    yield self.chunk(rest)
                yield self.chunk(None, self.reason())
                if include_usage:
                    usage = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                             "created": self.created, "model": self.service.name, "choices": [],
                             "usage": self.usage()}
                    yield f"data: {json.dumps(usage)}\n\n"
                yield "data: [DONE]\n\n"
                return
        finally:
            self.generation.cancel()  # a client that went away: its slot is freed at the engine's next step
