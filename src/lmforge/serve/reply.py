"""One request's tokens turned into the OpenAI shapes: the whole reply, or server-sent events as they come.

Tokens arrive from the engine's thread through the request's callbacks into an asyncio queue. A client that goes
away cancels its request, whichever way it asked: a stream's generator is closed by the server, and a whole
reply is watched by a task that waits for the connection's end (``watch``), so the slot is freed at the engine's
next step instead of decoding to ``max_tokens`` for nobody.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from typing import Any

from lmforge.serve.errors import HTTPError
from lmforge.serve.logprobs import chat_content, completion_columns, joined, shown
from lmforge.serve.tool_calls import CallReader


class Reply:
    """The answer to one completion or chat completion (``state``: the server's ``Served``). Its queue receives
    ("text", new text) once a token and at the end (the engine's outputs stage decodes and cuts at stop strings),
    then ("end", generation); ("gone", None) when the client left; with log-probabilities asked, ("token", id)
    before each token's text (the tokens whose log-probabilities a streamed chunk carries). ``calls``: a request
    with tools, whose text is read as text or tool calls (tool_calls.py)."""

    def __init__(self, state: Any, generation: Any, chat: bool, arrived: float, echo: tuple[str, list] | None = None,
                 logprobs: bool = False, calls: CallReader | None = None) -> None:
        self.state, self.generation, self.chat, self.arrived = state, generation, chat, arrived
        self.model = state.service.names[generation.request.adapter]  # the base's name, or the adapter's
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.first = True
        self.pieces: list[str] = []
        self.echo = echo  # completions: (the prompt's text, its (token, log-probability) pairs) to answer first
        self.logprobs = logprobs  # the request asked for log-probabilities (the engine keeps them)
        self.seen = self.listed = 0  # tokens the outputs stage has handed on; those whose log-probabilities went out
        self.calls = calls
        self.index = 0  # the choice this reply is, among the n of one request (streamed together: ``merged``)

    def token_logprobs(self, upto: int | None = None) -> dict[str, Any] | None:
        """The log-probabilities of the reply's tokens not yet sent, up to ``upto`` (default all), in this
        endpoint's shape; None when the request did not ask for them."""
        if not self.logprobs:
            return None
        g, tokenizer = self.generation, self.state.service.tokenizer
        end = len(g.logprobs) if upto is None else min(upto, len(g.logprobs))
        stops = (g.request.stop_ids or ()) if self.chat else ()  # a completion lists every token it generated
        pairs = shown(g.tokens[self.listed: end], g.logprobs[self.listed: end], stops)
        self.listed = max(self.listed, end)
        if self.chat:
            return {"content": chat_content(tokenizer, pairs)}
        columns = completion_columns(tokenizer, pairs, len(self.echo[0]) if self.echo else 0)
        return joined(completion_columns(tokenizer, self.echo[1]), columns) if self.echo else columns

    def text(self, new: str) -> str:
        if self.first:
            self.state.metrics.first_token(time.perf_counter() - self.arrived)
            self.first = False
        self.pieces.append(new)
        return new

    def reason(self) -> str:
        finish = "length" if self.generation.finish_reason == "length" else "stop"
        return self.calls.reason(finish) if self.calls is not None else finish

    def usage(self) -> dict[str, int]:
        prompt, completion = len(self.generation.request.ids), len(self.generation.tokens)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    async def whole(self, queue: asyncio.Queue, receive: Any) -> dict[str, Any] | None:
        """The reply once it has ended; None when the client went away first (its request is cancelled)."""
        watcher = asyncio.create_task(watch(receive, queue))
        try:
            while True:
                kind, value = await queue.get()
                if kind == "gone":
                    return None
                if kind == "end":
                    break
                if kind == "text":
                    self.text(value)
        finally:
            watcher.cancel()
            self.generation.cancel()  # no-op once it has ended; frees the slot if the client went away
        if self.generation.finish_reason == "error":
            raise HTTPError(500, f"the model failed on this request: {self.generation.error}")
        self.state.metrics.completion_tokens += len(self.generation.tokens)
        content = (self.echo[0] if self.echo else "") + "".join(self.pieces)
        if self.calls is not None:
            self.calls.feed(content)
        message = self.calls.message() if self.calls is not None else {"role": "assistant", "content": content}
        choice = {"index": 0, "message": message} if self.chat else {"index": 0, "text": content}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "usage": self.usage(),
                "choices": [{**choice, "finish_reason": self.reason(), "logprobs": self.token_logprobs()}]}

    def chunk(self, content: str | None, reason: str | None = None, role: bool = False,
              logprobs: dict[str, Any] | None = None, delta: dict[str, Any] | None = None) -> str:
        """One server-sent event: ``content`` (or a chat ``delta`` of tool calls), the finish reason at the end."""
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | ({"content": content} if content is not None else {}) \
                | (delta or {})
            choice: dict[str, Any] = {"index": self.index, "delta": delta}
        else:
            choice = {"index": self.index, "text": content or ""}
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model,
                "choices": [{**choice, "finish_reason": reason, "logprobs": logprobs}]}
        return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"

    def usage_chunk(self, usage: dict[str, int]) -> str:
        """The server-sent event that carries a stream's usage (``stream_options.include_usage``)."""
        body = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [], "usage": usage}
        return f"data: {json.dumps(body)}\n\n"

    async def events(self, queue: asyncio.Queue, include_usage: bool, done: bool = True):
        """The reply as server-sent events; ``done``: end with the usage (when asked) and ``[DONE]`` (not when it
        is one of n choices streamed together, ``merged``)."""
        try:
            if self.chat:
                yield self.chunk("" if self.calls is None else None, role=True)
            while True:
                kind, value = await queue.get()
                if kind == "token":
                    self.seen += 1
                    continue
                if kind == "text":
                    if self.text(value) and self.calls is None:  # with the log-probabilities of its tokens
                        yield self.chunk(value, logprobs=self.token_logprobs(self.seen))
                    for delta in self.calls.feed(value) if self.calls is not None else ():
                        yield self.chunk(None, logprobs=self.token_logprobs(self.seen), delta=delta)
                    continue
                self.state.metrics.completion_tokens += len(self.generation.tokens)
                if self.generation.finish_reason == "error":
                    message = f"the model failed on this request: {self.generation.error}"
                    yield f"data: {json.dumps({'error': {'message': message, 'type': 'server_error'}})}\n\n"
                    return
                yield self.chunk(None, self.reason(), logprobs=self.token_logprobs())
                if not done:
                    return
                if include_usage:
                    yield self.usage_chunk(self.usage())
                yield "data: [DONE]\n\n"
                return
        finally:
            self.generation.cancel()  # a client that went away: its slot is freed at the engine's next step


async def merged(replies: list[tuple[Reply, asyncio.Queue]], include_usage: bool, prompt_tokens: int):
    """n choices of one request streamed as one: each reply's events as they come (its chunks carry its index),
    then one usage (the prompt counted once, as OpenAI does) and one ``[DONE]``. A client that leaves ends every
    choice."""
    events: asyncio.Queue = asyncio.Queue()
    streams = [reply.events(queue, False, done=False) for reply, queue in replies]

    async def pump(stream) -> None:
        try:
            async for event in stream:
                await events.put(event)
        finally:
            await events.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            event = await events.get()
            if event is None:
                running -= 1
            else:
                yield event
        if include_usage:
            first = replies[0][0]
            completion = sum(reply.usage()["completion_tokens"] for reply, _ in replies)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                     "total_tokens": prompt_tokens + completion}
            yield first.usage_chunk(usage)
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            await stream.aclose()  # each generation cancelled (events' own finally)


async def watch(receive: Any, queue: asyncio.Queue) -> None:
    """Wait for the connection's end (the body was read already: what comes next is the disconnect), then say so."""
    while (await receive())["type"] != "http.disconnect":
        pass
    queue.put_nowait(("gone", None))
