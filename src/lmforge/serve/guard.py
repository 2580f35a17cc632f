"""What every request passes before a route sees it, as one ASGI layer around the app (``Guard``):

    draining?      a server stopping after SIGTERM answers 503 with Retry-After (so a balancer moves on)
    key            /v1/* and the tokenizer's routes need ``Authorization: Bearer KEY`` when ``--api-key`` is set
                   (compared in constant time)
    body           at most ``--max-body`` bytes, counted as they are read (Content-Length or chunked): 413 beyond,
                   and the rest is never read
    in flight      counted, so that a drain knows when the last response has been sent
    metrics, log   one counter per (route template, status): ``/v1/chat/completions``, never the raw path (a path
                   a client makes up is counted as "unmatched"); one JSON line per request on standard error

Every answer of its own is the OpenAI error object (``errors.error_body``).
"""

from __future__ import annotations

import hmac
import json
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from lmforge.serve.errors import KINDS, error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


TOKENIZER_ROUTES = ("/tokenize", "/detokenize", "/tokenizer_info")  # vLLM's and llama.cpp's paths, at the root

class Guard:
    """The ASGI layer described in the module docstring, over ``app``; ``state``: the server's ``Served``."""

    def __init__(self, app: App, state: Any) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = [500]

        async def sent(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        self.state.in_flight += 1
        try:
            refusal = self.refusal(scope)
            if refusal is None:
                body = await read_body(receive, self.state.options.max_body)
                if body is None:
                    refusal = 413, f"the request body is over {self.state.options.max_body} bytes (--max-body)", {}
            if refusal is not None:
                await respond(sent, *refusal)
            else:
                await self.app(scope, replay(body, receive), sent)
        finally:
            self.state.in_flight -= 1
            route = scope.get("route")
            self.state.metrics.request(getattr(route, "path", "unmatched"), status[0])
            print(json.dumps({"time": round(time.time(), 3), "method": scope["method"], "path": scope["path"],
                              "status": status[0], "ms": round(1000 * (time.perf_counter() - started), 1)}),
                  file=sys.stderr, flush=True)

    def refusal(self, scope: Scope) -> tuple[int, str, dict[str, str]] | None:
        """(status, message, headers) of a request refused before its body is read, or None."""
        options, path = self.state.options, scope["path"]
        if self.state.draining and path not in ("/metrics",):
            return 503, "the server is shutting down; retry on another instance", {"Retry-After": "5"}
        if options.api_key and (path.startswith("/v1/") or path in TOKENIZER_ROUTES):
            given = header(scope, b"authorization").removeprefix("Bearer ")
            if not hmac.compare_digest(given.encode(), options.api_key.encode()):
                return 401, "missing or wrong API key (Authorization: Bearer KEY)", {}
        length = header(scope, b"content-length")
        if length and (not length.isdigit() or int(length) > options.max_body):
            return 413, f"the request body is over {options.max_body} bytes (--max-body)", {}
        return None


def header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return ""


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, or None as soon as more than ``limit`` bytes have come (the rest is never read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(chunks)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives the body read already, then passes on what comes after (the disconnect)."""
    given = False

    async def again() -> Message:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return again


async def respond(send: Send, status: int, message: str, headers: dict[str, str]) -> None:
    body = json.dumps(error_body(message, KINDS.get(status, "invalid_request_error"))).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
           *((k.lower().encode(), v.encode()) for k, v in headers.items())]
    if status == 413:
        raw.append((b"connection", b"close"))  # the rest of the body is not read: the connection cannot go on
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
